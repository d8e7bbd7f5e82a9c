"""Open a GGUF file (llama.cpp's format): config, tensors under Hugging Face names, tokenizer.

Metadata and raw tensor bytes come from gguf-py's GGUFReader, dequantization from gguf-py's own
dequantizer (gguf_dequant); each tensor keeps the type the file gives it. A 2-D block-quantized tensor
can also be read as its raw block rows (TensorRef.read_blocks, for models.quant_linear). llama.cpp's
converter changes some tensors on the way in; each change is undone here so the weights equal the
Hugging Face checkpoint's (row and column permutations as `Permute`, which also applies to blocks):

- llama: q_proj / k_proj rows are permuted per head (from rotate-half to interleaved rope pairs).
- qwen35 (Qwen3.5/3.6): zero-centred norm weights are stored as w + 1 (except the DeltaNet's
  own `ssm_norm`); `ssm_a` holds -exp(A_log); `ssm_conv1d` is squeezed to [C, K]; and every
  axis indexed by DeltaNet value heads is stored tiled (v0k0 v0k1 .. v1k0 ..) where Hugging Face
  groups them by key head (k0v0 k0v1 .. k1v0 ..).
- qwen35 MTP files (`{arch}.nextn_predict_layers` = n > 0; block_count counts them): blocks
  num_layers .. num_layers + n - 1 are the MTP head. Their decoder-layer tensors carry the usual
  block names and become `mtp.layers.{i}.*`; `nextn.eh_proj` is `mtp.fc`, `nextn.enorm` /
  `nextn.hnorm` the pre-fc norms of the embedding / hidden halves, `nextn.shared_head_norm` the
  head's final norm (all stored as w + 1, like the target's norms). Each block repeats the four
  head tensors (llama.cpp's converter writes them per MTP block); we read the first. Qwen3.5 shares
  the target's embedding and lm_head, so `nextn.embed_tokens` / `nextn.shared_head_head` are refused.
- a missing `output.weight` means tied embeddings; `rope_freqs.weight` (llama 3 rope scaling)
  divides the rotary inverse frequencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from treeflash.errors import ModelLoadError
from treeflash.models.config import ModelConfig
from treeflash.models.checkpoint import Checkpoint, QuantBlocks, TensorRef
from treeflash.models.gguf_dequant import FLOAT_TYPES, can_dequantize, dequantize, readable_types, type_name
from treeflash.models.gguf_nextn import NEXTN_NAMES, NEXTN_REFUSED, mtp_name
from treeflash.models.rope import rope_parameters_from_gguf

ARCH_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen35": "qwen3_5_text"}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAMES = {  # blk.N.<gguf> -> model.layers.N.<ours>
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",  # qwen35's name for it
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
}
BLOCK_SPECIAL = {"ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias"}  # no .weight suffix
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
Fixup = Callable[[torch.Tensor], torch.Tensor]


def open_gguf(path: Path) -> Checkpoint:
    source = str(path)
    reader = read_gguf(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if k not in TOKENIZER_ARRAYS}
    arch = meta.get("general.architecture")
    if arch not in ARCH_MODEL_TYPE:
        raise ModelLoadError(f"{source}: unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCH_MODEL_TYPE)}")
    by_name = {t.name: t for t in reader.tensors}
    config = ModelConfig.from_hf_dict(hf_config_dict(meta, reader, by_name), source=source)
    num_layers = config.num_layers
    fixups = _fixups(arch, config)

    tensors: dict[str, TensorRef] = {}
    skipped: list[str] = []
    rope_freqs = None
    for name, t in by_name.items():
        if name == "rope_freqs.weight":
            rope_freqs = _tensor_ref(source, t, None, "rotary inverse frequency factors")
            continue
        ours = gguf_to_ours(name)
        if arch == "qwen35" and ours is not None and ours.startswith("model.layers."):
            ours = mtp_name(ours, name, num_layers, config.mtp_num_layers, source)
            if ours is None:  # a later MTP block's copy of the head tensors
                skipped.append(name)
                continue
        if ours is None:
            raise ModelLoadError(f"{source}: unexpected tensor {name}: no {arch} parameter has this name")
        leaf = ours.split(".", 3)[-1] if ours.startswith(("model.layers.", "mtp.layers.")) else ours
        tensors[ours] = _tensor_ref(source, t, fixups.get(leaf), ours)
    chat_template = meta.get("tokenizer.chat_template")
    return Checkpoint(
        source=source,
        config=config,
        tensors=tensors,
        load_tokenizer=lambda: gguf_tokenizer(reader, meta, source),
        chat_template=chat_template if isinstance(chat_template, str) else None,
        file_name=ours_to_gguf,
        rope_freq_factors=rope_freqs,
        skipped=skipped,
    )


class _Reader(GGUFReader):
    """GGUFReader with two changes: tensor extents checked against the file size (a truncated file
    names its first cut tensor), and metadata parsed from a plain ndarray view of the memmap
    (numpy's memmap slicing is ~3x slower over the 100k+ strings of a vocabulary)."""

    def __init__(self, path: Path):
        self._path = str(path)
        super().__init__(path)

    def _get(self, offset, dtype, count=1, override_order=None):
        flat = self.__dict__.get("_flat")
        if flat is None:
            flat = self._flat = self.data.view(np.ndarray)
        count = int(count)
        dt = np.dtype(dtype)
        arr = flat[offset : offset + dt.itemsize * count].view(dt)
        if arr.shape[0] < count:
            raise ValueError(f"read past the end of the file at byte {offset}")
        arr = arr[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _build_tensors(self, start_offs, fields):
        size = self.data.shape[0]
        for f in fields:
            _, name_data, _, dims, raw_type, offset = f.parts
            name = bytes(name_data).decode("utf-8", "replace")
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_type[0]))]
            except (ValueError, KeyError):
                raise ModelLoadError(f"{self._path}: tensor {name} has unknown ggml type {int(raw_type[0])}") from None
            end = start_offs + int(offset[0]) + math.prod(int(d) for d in dims) * type_size // block
            if end > size:
                raise ModelLoadError(f"{self._path}: truncated or corrupt: tensor {name} ends at byte {end}, the file has {size}")
        super()._build_tensors(start_offs, fields)


def read_gguf(path: Path) -> GGUFReader:
    try:
        return _Reader(path)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file (truncated or corrupt header?): {e}") from None


def _meta_get(meta: dict[str, Any], arch: str, key: str, default: Any = None, source: str = "") -> Any:
    value = meta.get(f"{arch}.{key}", default)
    if value is None:
        raise ModelLoadError(f"{source}: missing metadata {arch}.{key}")
    return value


def hf_config_dict(meta: dict[str, Any], reader: GGUFReader, by_name: dict[str, Any]) -> dict[str, Any]:
    """GGUF metadata -> a Hugging Face style config dict (for ModelConfig.from_hf_dict)."""
    arch = meta["general.architecture"]
    source = reader._path if hasattr(reader, "_path") else ""

    def get(key, default=None):
        return _meta_get(meta, arch, key, default, source)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // heads))
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else int(by_name["token_embd.weight"].shape[-1])
    rope_parameters = rope_parameters_from_gguf(meta, arch, source)
    eos = [meta.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    eos = [int(e) for i, e in enumerate(eos) if e is not None and e not in eos[:i]]
    cfg: dict[str, Any] = {
        "model_type": ARCH_MODEL_TYPE[arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 32768)),
        "tie_word_embeddings": "output.weight" not in by_name,
        "attention_bias": "blk.0.attn_q.bias" in by_name,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos or None,
    }
    if rope_parameters:
        cfg["rope_parameters"] = {"rope_theta": cfg["rope_theta"], **rope_parameters}
    if arch == "qwen35":
        mtp_layers = int(meta.get("qwen35.nextn_predict_layers", 0))
        v_heads = int(get("ssm.time_step_rank"))
        cfg.update(
            num_hidden_layers=cfg["num_hidden_layers"] - mtp_layers,  # the file counts the MTP block as a layer
            full_attention_interval=int(get("full_attention_interval")),
            partial_rotary_factor=int(get("rope.dimension_count")) / head_dim,
            linear_conv_kernel_dim=int(get("ssm.conv_kernel")),
            linear_key_head_dim=int(get("ssm.state_size")),
            linear_num_key_heads=int(get("ssm.group_count")),
            linear_num_value_heads=v_heads,
            linear_value_head_dim=int(get("ssm.inner_size")) // v_heads,
            mtp_num_hidden_layers=mtp_layers,
        )
    return cfg


def gguf_to_ours(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) >= 3 and parts[1].isdigit():
        prefix, rest = f"model.layers.{parts[1]}.", ".".join(parts[2:])
        if rest in BLOCK_SPECIAL:
            return prefix + BLOCK_SPECIAL[rest]
        leaf, _, suffix = rest.rpartition(".")
        if leaf in BLOCK_NAMES and suffix in ("weight", "bias"):
            return f"{prefix}{BLOCK_NAMES[leaf]}.{suffix}"
        if (leaf in NEXTN_NAMES or leaf in NEXTN_REFUSED) and suffix == "weight":
            return f"{prefix}{leaf}.{suffix}"
        return None
    leaf, _, suffix = name.rpartition(".")
    if leaf in TOP_NAMES and suffix in ("weight", "bias"):
        return f"{TOP_NAMES[leaf]}.{suffix}"
    return None


def ours_to_gguf(name: str) -> str:
    """Our name -> the GGUF name llama.cpp would use (for error messages)."""
    if name.startswith("mtp."):
        rest = name[len("mtp."):]
        for g, o in NEXTN_NAMES.items():
            if rest == o + ".weight":
                return f"blk.N.{g}.weight (N = the first MTP block)"
        if rest.startswith("layers."):
            _, i, leaf = rest.split(".", 2)
            return ours_to_gguf(f"model.layers.{i}.{leaf}").replace(f"blk.{i}.", f"blk.(N+{i}).", 1)
    if name.startswith("model.layers."):
        _, _, i, rest = name.split(".", 3)
        for table in (BLOCK_SPECIAL, BLOCK_NAMES):
            for g, o in table.items():
                if rest == o:
                    return f"blk.{i}.{g}"
                if rest.startswith(o + "."):
                    return f"blk.{i}.{g}{rest[len(o):]}"
    for g, o in TOP_NAMES.items():
        if name.startswith(o + "."):
            return g + name[len(o) :]
    return name


def _tensor_ref(source: str, t, fixup: "Fixup | None", ours: str) -> TensorRef:
    """A GGUF tensor -> TensorRef that dequantizes (on the target device) and undoes llama.cpp's changes;
    a 2-D block-quantized one whose fix-up (if any) is a Permute can also be read as its block rows."""
    gguf_shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml lists dims innermost first
    ggml_type = int(t.tensor_type)
    if not can_dequantize(ggml_type):
        raise ModelLoadError(f"{source}: tensor {t.name} has type {type_name(ggml_type)}, which treeflash can neither "
                             f"run nor dequantize (readable types: {', '.join(readable_types())})")
    shape = tuple(fixup(torch.empty(gguf_shape, device="meta")).shape) if fixup else gguf_shape

    def raw_bytes(device: torch.device) -> torch.Tensor:  # [nbytes] uint8
        return torch.from_numpy(np.array(t.data.reshape(-1).view(np.uint8))).to(device)

    def read(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        if fixup is None:
            return dequantize(raw_bytes(device), ggml_type, gguf_shape, dtype)
        return fixup(dequantize(raw_bytes(device), ggml_type, gguf_shape, torch.float32)).to(dtype).contiguous()

    read_blocks = None
    if len(gguf_shape) == 2 and ggml_type not in FLOAT_TYPES and (fixup is None or isinstance(fixup, Permute)):
        def read_blocks(device: torch.device) -> QuantBlocks:
            blocks = raw_bytes(device).view(gguf_shape[0], -1)  # [N, row bytes]: each row's blocks
            in_index = None
            if isinstance(fixup, Permute) and fixup.dim == 0:
                blocks = blocks.index_select(0, fixup.index.to(device))
            elif isinstance(fixup, Permute):  # columns: x W[:, p]^T = x[:, p^-1] W^T
                in_index = torch.argsort(fixup.index).to(device)
            return QuantBlocks(blocks.contiguous(), type_name(ggml_type), in_index)

    return TensorRef(shape=shape, read=read, origin=f"{t.name} ({ours})", ggml_type=ggml_type, read_blocks=read_blocks)


@dataclass(frozen=True)
class Permute:
    """A fix-up that reorders one axis of a 2-D (or 1-D) tensor: w.index_select(dim, index). Unlike an
    arbitrary function it also applies to a tensor kept as GGUF blocks (rows: reorder block rows;
    columns: the layer gathers its input instead)."""

    dim: int
    index: torch.Tensor  # [size of dim] long

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        return w.index_select(self.dim, self.index.to(w.device))


# -- undoing llama.cpp's conversion --


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp stores each head's rows as interleaved rope pairs (0, d/2, 1, d/2+1, ...); HF as halves."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def grouped_from_tiled(num_k_heads: int, v_per_k: int, head_dim: int = 1) -> torch.Tensor:
    """Index i of the result is the tiled position of grouped element i (k, v, d)."""
    tiled = torch.arange(num_k_heads * v_per_k * head_dim).reshape(v_per_k, num_k_heads, head_dim)
    return tiled.transpose(0, 1).reshape(-1)


def _fixups(arch: str, c: ModelConfig) -> dict[str, Fixup]:
    """Per parameter leaf name (without `model.layers.N.`): the function undoing llama.cpp's change."""
    if arch == "llama":
        q = Permute(0, unpermute_qk(torch.arange(c.num_heads * c.head_dim), c.num_heads))
        k = Permute(0, unpermute_qk(torch.arange(c.num_kv_heads * c.head_dim), c.num_kv_heads))
        return {"self_attn.q_proj.weight": q, "self_attn.q_proj.bias": q, "self_attn.k_proj.weight": k, "self_attn.k_proj.bias": k}
    if arch != "qwen35":
        return {}
    v_per_k = c.linear_num_value_heads // c.linear_num_key_heads
    per_value = grouped_from_tiled(c.linear_num_key_heads, v_per_k, c.linear_value_head_dim)
    per_head = grouped_from_tiled(c.linear_num_key_heads, v_per_k)
    qk_rows = 2 * c.linear_num_key_heads * c.linear_key_head_dim

    def minus_one(w):
        return w - 1.0

    value_rows = Permute(0, torch.cat((torch.arange(qk_rows), qk_rows + per_value)))  # fused q, k, v: only v reordered

    fix: dict[str, Fixup] = {
        "model.norm.weight": minus_one,
        "mtp.pre_fc_norm_embedding.weight": minus_one,
        "mtp.pre_fc_norm_hidden.weight": minus_one,
        "mtp.norm.weight": minus_one,
        "input_layernorm.weight": minus_one,
        "post_attention_layernorm.weight": minus_one,
        "self_attn.q_norm.weight": minus_one,
        "self_attn.k_norm.weight": minus_one,
        "linear_attn.A_log": lambda a: torch.log(-a)[per_head.to(a.device)],
        "linear_attn.dt_bias": lambda b: b[per_head.to(b.device)],
        "linear_attn.in_proj_a.weight": Permute(0, per_head),
        "linear_attn.in_proj_b.weight": Permute(0, per_head),
        "linear_attn.in_proj_z.weight": Permute(0, per_value),
        "linear_attn.in_proj_qkv.weight": value_rows,
        "linear_attn.conv1d.weight": lambda w: value_rows(w)[:, None, :],
        "linear_attn.out_proj.weight": Permute(1, per_value),
    }
    return fix


def gguf_tokenizer(reader: GGUFReader, meta: dict[str, Any], source: str):
    """A transformers fast tokenizer from the GGUF vocabulary, via transformers' own GGUF converters."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    values = dict(meta)
    for key in TOKENIZER_ARRAYS:
        if key in reader.fields:
            values[key] = reader.fields[key].contents()
    if "tokenizer.ggml.tokens" not in values:
        raise ModelLoadError(f"{source}: no tokenizer in the GGUF metadata (tokenizer.ggml.tokens)")
    sections = {
        section: {name: values[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in values}
        for section, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tok_dict, tok_config = sections["tokenizer"], sections["tokenizer_config"]
    tokens = tok_dict["tokens"]
    try:
        backend, extra = convert_gguf_tokenizer(ARCH_MODEL_TYPE[meta["general.architecture"]], tok_dict)
    except Exception as e:
        raise ModelLoadError(f"{source}: cannot build the tokenizer from the GGUF vocabulary: {e}") from None
    kwargs = {**extra, **tok_config}
    # special tokens by the file's ids (transformers' llama converter names eos after the bos id)
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        token_id = tok_config.get(f"{name}_id")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            kwargs[name] = tokens[int(token_id)]
    kwargs["clean_up_tokenization_spaces"] = False  # a byte-level BPE decodes exactly; cleanup would drop spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
