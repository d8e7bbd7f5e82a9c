"""DFlashConfig: a DFlash drafter's shape and attention rules, read from z-lab's config.json (a Qwen3 config plus
`dflash_config` {target_layer_ids, mask_token_id, block_size}). The sliding-window rules follow transformers'
Qwen3Config: `sliding_window` counts only when `use_sliding_window` is true, and missing `layer_types` are derived
from it and `max_window_layers`. The model itself is spec/dflash_model.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from treeflash.errors import ModelLoadError
from treeflash.models.config import ModelConfig

FULL = "full_attention"
SLIDING = "sliding_attention"
@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_layer_ids: tuple[int, ...]  # target layers whose outputs are the context features
    mask_token_id: int
    block_size: int = 16  # B: the root plus B - 1 masks, drafting depths 1 .. B-1
    rms_norm_eps: float = 1e-6
    rope: ModelConfig | None = field(default=None, repr=False)  # rotary settings (rope_theta, scaling) as a qwen3 ModelConfig
    attention_bias: bool = False
    layer_types: tuple[str, ...] = ()  # per layer: full_attention | sliding_attention
    sliding_window: int | None = None
    is_causal: bool | None = None  # None: causal exactly on sliding layers (the reference's rule)
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ModelLoadError(f"dflash: layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        for t in self.layer_types:
            if t not in (FULL, SLIDING):
                raise ModelLoadError(f"dflash: unsupported layer type {t!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"dflash: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.block_size < 2:
            raise ModelLoadError(f"dflash: block_size must be >= 2, got {self.block_size}")
        if not self.target_layer_ids:
            raise ModelLoadError("dflash: dflash_config.target_layer_ids is empty")
        if self.rope is None:
            object.__setattr__(self, "rope", _rope_config({}, self))

    def layer_causal(self, i: int) -> bool:
        return self.layer_types[i] == SLIDING if self.is_causal is None else self.is_causal

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_types[i] == SLIDING else None

    @staticmethod
    def from_dict(cfg: dict[str, Any], source: str = "config.json") -> "DFlashConfig":
        """From a z-lab checkpoint's config.json (values in `dflash_config` win over top-level ones)."""
        if "DFlash2DraftModel" in (cfg.get("architectures") or []):
            raise ModelLoadError(f"{source}: DFlash2DraftModel checkpoints (conv layers + candidate selector) are not supported; use a DFlash (v1) drafter")
        extra = cfg.get("dflash_config") or {}

        def value(name: str, default: Any = None) -> Any:
            return extra.get(name, cfg.get(name, default))

        try:
            heads = int(cfg["num_attention_heads"])
            num_layers = int(cfg["num_hidden_layers"])
            window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
            layer_types = cfg.get("layer_types")
            if not layer_types:
                first = int(cfg.get("max_window_layers", 28))
                layer_types = [SLIDING if window is not None and i >= first else FULL for i in range(num_layers)]
            if value("target_layer_ids") is None:
                raise ModelLoadError(f"{source}: dflash_config.target_layer_ids is missing")
            if value("mask_token_id") is None:
                raise ModelLoadError(f"{source}: dflash_config.mask_token_id is missing")
            if cfg.get("hidden_act", "silu") != "silu":
                raise ModelLoadError(f"{source}: hidden_act {cfg['hidden_act']!r} is not supported (silu only)")
            softcap = value("final_logit_softcapping")
            partial = DFlashConfig(
                hidden_size=int(cfg["hidden_size"]),
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=num_layers,
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or 128),  # transformers' Qwen3Config default
                target_layer_ids=tuple(int(i) for i in value("target_layer_ids")),
                mask_token_id=int(value("mask_token_id")),
                block_size=int(value("block_size", 16)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                attention_bias=bool(cfg.get("attention_bias", False)),
                layer_types=tuple(layer_types),
                sliding_window=None if window is None else int(window),
                is_causal=None if cfg.get("is_causal") is None else bool(cfg["is_causal"]),
                input_embedding_scale=float(value("input_embedding_scale", 1.0)),
                output_multiplier=float(value("output_multiplier", 1.0)),
                final_logit_softcapping=None if softcap is None or float(softcap) <= 0 else float(softcap),
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: missing field {e.args[0]!r}") from None
        return replace(partial, rope=_rope_config(cfg, partial))


def _rope_config(cfg: dict[str, Any], c: DFlashConfig) -> ModelConfig:
    """The rotary settings of a Qwen3 config, read by the target's own config parser."""
    return ModelConfig.from_hf_dict(
        {
            **cfg,
            "model_type": "qwen3",
            "vocab_size": cfg.get("vocab_size", 1),
            "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "layer_types": None,
        }
    )
