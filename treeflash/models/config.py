"""ModelConfig: one frozen description of every target architecture we run.

Built from a Hugging Face config.json (`from_hf_dict`) or from GGUF metadata
(models/gguf_loader.py). Validated once, here; the model code trusts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treeflash.errors import ModelLoadError
from treeflash.models.rope import parse_scaling

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3_5")
FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # one of ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0  # fraction of head_dim that is rotated (qwen3_5: 0.25)
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qwen2: bias on q/k/v
    qk_norm: bool = False  # qwen3, qwen3_5: RMSNorm on q and k per head
    norm_unit_offset: bool = False  # qwen3_5: RMSNorm scales by (1 + weight), weights stored zero-centred
    attn_output_gate: bool = False  # qwen3_5: q_proj also yields a sigmoid gate on the output
    layer_types: tuple[str, ...] = ()  # per layer: full_attention | linear_attention
    # Gated DeltaNet (qwen3_5 linear_attention layers)
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    # MTP head (Qwen3.5/3.6 checkpoints): number of extra layers under `mtp.*`
    mtp_num_layers: int = 0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # linear / llama3 / yarn parameters as sorted items (models/rope.py)
    extra: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ModelLoadError(f"unknown architecture {self.arch!r}; supported: {', '.join(ARCHITECTURES)}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ModelLoadError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        for t in self.layer_types:
            if t not in (FULL_ATTENTION, LINEAR_ATTENTION):
                raise ModelLoadError(f"unsupported layer type {t!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if LINEAR_ATTENTION in self.layer_types and self.linear_num_value_heads % self.linear_num_key_heads:
            raise ModelLoadError("linear_num_value_heads must be a multiple of linear_num_key_heads")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION]

    @property
    def linear_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION]

    @property
    def is_hybrid(self) -> bool:
        return LINEAR_ATTENTION in self.layer_types

    @staticmethod
    def from_hf_dict(cfg: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        """Build from a Hugging Face config.json dict (VL wrappers unwrap to their text_config)."""
        if "text_config" in cfg and isinstance(cfg["text_config"], dict):
            top_eos = cfg.get("eos_token_id")
            cfg = {**cfg["text_config"]}
            cfg.setdefault("eos_token_id", top_eos)
        model_type = cfg.get("model_type", "")
        arch = {
            "llama": "llama",
            "qwen2": "qwen2",
            "qwen3": "qwen3",
            "qwen3_5": "qwen3_5",
            "qwen3_5_text": "qwen3_5",
        }.get(model_type)
        if arch is None:
            raise ModelLoadError(f"{source}: unknown model_type {model_type!r}; supported: llama, qwen2, qwen3, qwen3_5")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
            rope_theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
            partial = float(cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25 if arch == "qwen3_5" else 1.0)))
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((int(eos),) if eos is not None else ())
            max_pos = int(cfg.get("max_position_embeddings", 32768))
            if cfg.get("original_max_position_embeddings") and rope.get("rope_type", rope.get("type")) in ("llama3", "yarn"):
                rope = {**rope, "original_max_position_embeddings": cfg["original_max_position_embeddings"]}  # Phi3-style top-level key wins, as in transformers
            scaling = parse_scaling(rope, max_pos, source)
            layer_types = tuple(cfg.get("layer_types") or ())
            if arch == "qwen3_5" and not layer_types:
                interval = int(cfg.get("full_attention_interval", 4))
                layer_types = tuple(LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(int(cfg["num_hidden_layers"])))
            if arch != "qwen3_5":
                layer_types = ()  # sliding windows on dense targets are not lossless; we run full attention
            return ModelConfig(
                arch=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                partial_rotary_factor=partial,
                max_position_embeddings=max_pos,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
                qk_norm=arch in ("qwen3", "qwen3_5"),
                attn_output_gate=arch == "qwen3_5",
                norm_unit_offset=arch == "qwen3_5",
                layer_types=layer_types,
                linear_conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim", 4)),
                linear_key_head_dim=int(cfg.get("linear_key_head_dim", 128)),
                linear_value_head_dim=int(cfg.get("linear_value_head_dim", 128)),
                linear_num_key_heads=int(cfg.get("linear_num_key_heads", 16)),
                linear_num_value_heads=int(cfg.get("linear_num_value_heads", 32)),
                mtp_num_layers=int(cfg.get("mtp_num_hidden_layers", 0) or 0),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                rope_scaling=scaling,
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: missing field {e.args[0]!r}") from None
