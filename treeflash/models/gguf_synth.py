"""Random-weight GGUF files at real shapes, written the way llama.cpp lays them out.

Speed and memory work on quantized weights needs files of the real size and type mix (a 27B
Q4_K_M is about 16.5 GB), not real weights: decode reads every block once whatever its values. So
this writes llama.cpp's tensor names and metadata (`qwen35` for Qwen3.5/3.6, `qwen3`, `llama`), each
tensor in the type a mix gives it, with random block bytes whose fp16 scale fields hold one fixed
value per type, chosen so the dequantized weights have mean ~0 and std `WEIGHT_STD` (outputs stay
finite through 64 layers). Blocks are not quantized from float weights: a pool of random blocks per
type is tiled with a random offset, so a 16 GB file is written at disk speed.

Mixes (per tensor; a row length the type cannot hold falls back to Q8_0, then F32):
- q4_k_m: llama.cpp's Q4_K_M recipe: Q4_K, with the output head, and attn_v / ffn_down in the first
  and last eighths and every third layer between, at Q6_K.
- ud-q3_k_xl: an Unsloth-Dynamic-like mix: embeddings, output head, attention and the DeltaNet
  projections at Q6_K, the MTP block at Q8_0, the dense FFN at Q3_K.
- q8_0, q4_0, q6_k: one type for every matrix (tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as T

WEIGHT_STD = 0.02
POOL_BLOCKS = 1 << 14  # random blocks per type, tiled over each tensor

# byte offsets of the fp16 scale d and of the fp16 offset field (m / dmin, None if the type has none)
SCALE_FIELDS: dict[T, tuple[int, int | None]] = {
    T.Q8_0: (0, None), T.Q4_0: (0, None), T.Q4_1: (0, 2), T.Q5_0: (0, None), T.Q5_1: (0, 2),
    T.Q2_K: (80, 82), T.Q3_K: (108, None), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208, None),
    T.IQ4_NL: (0, None), T.IQ4_XS: (0, None), T.IQ2_XXS: (0, None), T.IQ2_XS: (0, None), T.IQ2_S: (0, None),
    T.IQ3_XXS: (0, None), T.IQ3_S: (0, None), T.IQ1_S: (0, None),
}
FLOATS = {T.F32: np.float32, T.F16: np.float16}


@dataclass(frozen=True)
class SynthShape:
    """The hyperparameters of a model to write (names as ModelConfig's)."""

    arch: str  # GGUF architecture: llama, qwen3, qwen35
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1e6
    context_length: int = 32768
    full_attention_interval: int = 4  # qwen35: every 4th layer full attention, the rest Gated DeltaNet
    partial_rotary_factor: float = 1.0
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 48
    mtp_layers: int = 0  # qwen35: llama.cpp's nextn block(s) after the last layer


SHAPES: dict[str, SynthShape] = {
    # Qwen3.5-27B (as models/gguf_loader.py reads it): 64 layers = 48 Gated DeltaNet + 16 gated attention,
    # hidden 5120, MLP 17408, attention 24 q / 4 kv heads of 256 (partial rotary 0.25), DeltaNet 16 k / 48 v
    # heads of 128, vocab 248320, one MTP block
    "qwen3.5-27b": SynthShape("qwen35", 248320, 5120, 17408, 64, 24, 4, 256, rope_theta=1e7, context_length=262144,
                              partial_rotary_factor=0.25, mtp_layers=1),
    # Qwen3-8B: 36 layers, hidden 4096, 32 q / 8 kv heads of 128, MLP 12288, vocab 151936
    "qwen3-8b": SynthShape("qwen3", 151936, 4096, 12288, 36, 32, 8, 128, context_length=40960),
    # tiny variants (tests, CPU checks of the tools): every row length a multiple of 256
    "tiny-hybrid": SynthShape("qwen35", 512, 256, 512, 4, 4, 2, 64, partial_rotary_factor=0.25, linear_key_head_dim=32,
                              linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, mtp_layers=1),
    "tiny-dense": SynthShape("qwen3", 512, 256, 512, 2, 4, 2, 64),
    "tiny-llama": SynthShape("llama", 512, 256, 512, 2, 4, 2, 64, rope_theta=1e4),
}


# -- type mixes --


def _more_bits(layer: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third one between."""
    return layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2


def _q4_k_m(leaf: str, layer: int | None, n: int) -> T:
    if leaf == "output":
        return T.Q6_K
    if layer is not None and layer >= n:  # the MTP block
        return T.Q8_0
    if leaf in ("attn_v", "ffn_down") and layer is not None and _more_bits(layer, n):
        return T.Q6_K
    if leaf in ("ssm_alpha", "ssm_beta"):
        return T.Q8_0
    return T.Q4_K


def _ud_q3_k_xl(leaf: str, layer: int | None, n: int) -> T:
    if layer is not None and layer >= n:
        return T.Q8_0
    if leaf in ("ffn_gate", "ffn_up", "ffn_down"):
        return T.Q3_K
    if leaf in ("ssm_alpha", "ssm_beta"):
        return T.Q8_0
    return T.Q6_K


MIXES: dict[str, Callable[[str, int | None, int], T]] = {
    "q4_k_m": _q4_k_m,
    "ud-q3_k_xl": _ud_q3_k_xl,
    "q8_0": lambda leaf, layer, n: T.Q8_0,
    "q4_0": lambda leaf, layer, n: T.Q4_0,
    "q6_k": lambda leaf, layer, n: T.Q6_K,
}


def fitting_type(want: T, row: int) -> T:
    """`want`, or the nearest type whose block divides a row of `row` values (as llama.cpp falls back)."""
    for t in (want, T.Q8_0, T.F32):
        if row % GGML_QUANT_SIZES[t][0] == 0:
            return t
    return T.F32


# -- random blocks with sane scales --


def _f16_bytes(x: float) -> np.ndarray:  # [2] uint8, little-endian fp16
    return np.array([x], dtype="<f2").view(np.uint8)


def _scale_pattern(qtype: T, pool: np.ndarray) -> tuple[np.float16, np.float16 | None]:
    """The fixed (d, offset) fp16 values for `pool`'s random codes: mean ~0, std WEIGHT_STD (calibrated
    through gguf's dequantizer: the values are d * A + offset * B, linear in both fields)."""
    d_at, o_at = SCALE_FIELDS[qtype]
    one, zero = _f16_bytes(1.0), _f16_bytes(0.0)
    probe = pool[:256].copy()

    def values(d, o):
        probe[:, d_at : d_at + 2] = d
        if o_at is not None:
            probe[:, o_at : o_at + 2] = o
        return quants.dequantize(probe, qtype).astype(np.float64)

    a = values(one, zero)
    ratio = 0.0
    if o_at is not None:
        b = values(zero, one)
        ratio = -a.mean() / b.mean() if b.mean() else 0.0
        a = a + ratio * b
    d = WEIGHT_STD / max(a.std(), 1e-30)
    return np.float16(d), (np.float16(ratio * d) if o_at is not None else None)


class BlockPool:
    """Random blocks of one type with its fixed scale pattern, tiled over tensors of any size."""

    def __init__(self, qtype: T, rng: np.random.Generator, blocks: int = POOL_BLOCKS):
        if qtype not in SCALE_FIELDS:
            raise ValueError(f"no random-block writer for {qtype.name}; writable: {', '.join(t.name for t in SCALE_FIELDS)}")
        self.qtype, self.rng = qtype, rng
        self.values, self.size = GGML_QUANT_SIZES[qtype]
        pool = rng.integers(0, 256, size=(blocks, self.size), dtype=np.uint8)
        d, o = _scale_pattern(qtype, pool)
        d_at, o_at = SCALE_FIELDS[qtype]
        pool[:, d_at : d_at + 2] = _f16_bytes(d)
        if o_at is not None:
            pool[:, o_at : o_at + 2] = _f16_bytes(o)
        self.pool = pool

    def tensor(self, rows: int, row_values: int) -> np.ndarray:  # [rows, row bytes] uint8
        per_row = row_values // self.values
        n = rows * per_row
        start = int(self.rng.integers(len(self.pool)))
        idx = (start + np.arange(n, dtype=np.int64)) % len(self.pool)
        return self.pool.take(idx, axis=0).reshape(rows, per_row * self.size)


def random_blocks(qtype: T, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """[rows, row bytes] uint8: random `qtype` blocks for a [rows, row_values] weight (small tensors, tests)."""
    return BlockPool(qtype, rng, blocks=max(256, shape[0] * shape[1] // GGML_QUANT_SIZES[qtype][0])).tensor(*shape)


# -- the tensors of a shape --


@dataclass(frozen=True)
class PlannedTensor:
    name: str  # llama.cpp's name
    shape: tuple[int, ...]  # numpy order (outermost first): [rows, row values] for a matrix
    qtype: T
    fill: str  # "blocks", "normal" (N(0, WEIGHT_STD)), "ones", "one_plus" (1 + N(0, 0.02): qwen35 norms), "ssm_a"


def tensor_plan(shape: SynthShape, mix: str) -> Iterator[PlannedTensor]:
    """Every tensor of the file, in llama.cpp's names, with the type `mix` gives it."""
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}; known: {', '.join(MIXES)}")
    pick, s, n = MIXES[mix], shape, shape.num_layers
    hybrid = s.arch == "qwen35"
    norm_fill = "one_plus" if hybrid else "ones"

    def matrix(name: str, leaf: str, layer: int | None, rows: int, cols: int) -> PlannedTensor:
        t = fitting_type(pick(leaf, layer, n), cols)
        return PlannedTensor(name, (rows, cols), t, "normal" if t in FLOATS else "blocks")

    def vector(name: str, size: int, fill: str) -> PlannedTensor:
        return PlannedTensor(name, (size,), T.F32, fill)

    h, d = s.hidden_size, s.head_dim
    yield matrix("token_embd.weight", "token_embd", None, s.vocab_size, h)
    yield vector("output_norm.weight", h, norm_fill)
    yield matrix("output.weight", "output", None, s.vocab_size, h)
    q_rows = s.num_heads * d * (2 if hybrid else 1)  # qwen35's q_proj also yields the output gate
    key_dim, value_dim = s.linear_num_key_heads * s.linear_key_head_dim, s.linear_num_value_heads * s.linear_value_head_dim
    for i in range(n + (s.mtp_layers if hybrid else 0)):
        p = f"blk.{i}."
        full = not hybrid or (i + 1) % s.full_attention_interval == 0 or i >= n
        yield vector(p + "attn_norm.weight", h, norm_fill)
        yield vector(p + ("post_attention_norm.weight" if hybrid else "ffn_norm.weight"), h, norm_fill)
        if full:
            yield matrix(p + "attn_q.weight", "attn_q", i, q_rows, h)
            yield matrix(p + "attn_k.weight", "attn_k", i, s.num_kv_heads * d, h)
            yield matrix(p + "attn_v.weight", "attn_v", i, s.num_kv_heads * d, h)
            yield matrix(p + "attn_output.weight", "attn_output", i, h, s.num_heads * d)
            if s.arch != "llama":
                yield vector(p + "attn_q_norm.weight", d, norm_fill)
                yield vector(p + "attn_k_norm.weight", d, norm_fill)
        else:
            yield matrix(p + "attn_qkv.weight", "attn_qkv", i, 2 * key_dim + value_dim, h)
            yield matrix(p + "attn_gate.weight", "attn_gate", i, value_dim, h)
            yield matrix(p + "ssm_alpha.weight", "ssm_alpha", i, s.linear_num_value_heads, h)
            yield matrix(p + "ssm_beta.weight", "ssm_beta", i, s.linear_num_value_heads, h)
            yield PlannedTensor(p + "ssm_conv1d.weight", (2 * key_dim + value_dim, s.linear_conv_kernel_dim), T.F32, "normal")
            yield vector(p + "ssm_norm.weight", s.linear_value_head_dim, "ones")
            yield matrix(p + "ssm_out.weight", "ssm_out", i, h, value_dim)
            yield vector(p + "ssm_a", s.linear_num_value_heads, "ssm_a")
            yield vector(p + "ssm_dt.bias", s.linear_num_value_heads, "ones")
        yield matrix(p + "ffn_gate.weight", "ffn_gate", i, s.intermediate_size, h)
        yield matrix(p + "ffn_up.weight", "ffn_up", i, s.intermediate_size, h)
        yield matrix(p + "ffn_down.weight", "ffn_down", i, h, s.intermediate_size)
        if i >= n:  # llama.cpp's nextn (MTP) tensors
            yield matrix(p + "nextn.eh_proj.weight", "nextn", i, h, 2 * h)
            for leaf in ("enorm", "hnorm", "shared_head_norm"):
                yield vector(p + f"nextn.{leaf}.weight", h, norm_fill)


def plan_bytes(shape: SynthShape, mix: str) -> int:
    """The tensor data size of the file (without metadata)."""
    total = 0
    for t in tensor_plan(shape, mix):
        values, size = GGML_QUANT_SIZES[t.qtype]
        total += int(np.prod(t.shape)) // values * size
    return total


# -- the file --


def _tokens(vocab: int) -> list[str]:
    """A byte-level BPE vocabulary of `vocab` entries: printable characters, then filler tokens, then
    the special tokens (eos last)."""
    base = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["ab"]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    filler = [f"<|t{i}|>" for i in range(vocab - len(base) - len(specials))]
    return base + filler + specials


def _metadata(w: GGUFWriter, s: SynthShape, mix: str) -> None:
    w.add_name(f"treeflash synthetic {mix}")
    w.add_block_count(s.num_layers + (s.mtp_layers if s.arch == "qwen35" else 0))
    w.add_context_length(s.context_length)
    w.add_embedding_length(s.hidden_size)
    w.add_feed_forward_length(s.intermediate_size)
    w.add_head_count(s.num_heads)
    w.add_head_count_kv(s.num_kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(s.rope_theta)
    if s.arch == "qwen35":
        w.add_full_attention_interval(s.full_attention_interval)
        w.add_ssm_conv_kernel(s.linear_conv_kernel_dim)
        w.add_ssm_state_size(s.linear_key_head_dim)
        w.add_ssm_group_count(s.linear_num_key_heads)
        w.add_ssm_time_step_rank(s.linear_num_value_heads)
        w.add_ssm_inner_size(s.linear_num_value_heads * s.linear_value_head_dim)
        w.add_rope_dimension_count(int(s.head_dim * s.partial_rotary_factor))
        w.add_nextn_predict_layers(s.mtp_layers)
    tokens = _tokens(s.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 3) + [3, 3, 3])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _fill(t: PlannedTensor, pools: dict[T, BlockPool], rng: np.random.Generator) -> np.ndarray:
    if t.fill == "blocks":
        if t.qtype not in pools:
            pools[t.qtype] = BlockPool(t.qtype, rng)
        return pools[t.qtype].tensor(*t.shape)
    if t.fill == "normal":
        return (rng.standard_normal(t.shape, dtype=np.float32) * WEIGHT_STD).astype(FLOATS[t.qtype])
    if t.fill == "ones":
        return np.ones(t.shape, dtype=np.float32)
    if t.fill == "one_plus":
        return 1.0 + rng.standard_normal(t.shape, dtype=np.float32) * 0.02
    if t.fill == "ssm_a":  # qwen35 stores -exp(A_log); A_log ~ log U(1, 16) as at initialization
        return -rng.uniform(1.0, 16.0, t.shape).astype(np.float32)
    raise ValueError(t.fill)


def write_synth_gguf(path: str | Path, shape: str | SynthShape, mix: str, seed: int = 0,
                     progress: Callable[[str, int], None] | None = None) -> Path:
    """Write a random-weight GGUF of `shape` (a SHAPES name or a SynthShape) in `mix`; returns the path.
    Streams tensor by tensor (memory: one tensor at a time). progress(name, bytes so far), if given."""
    s = SHAPES[shape] if isinstance(shape, str) else shape
    plan = list(tensor_plan(s, mix))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), s.arch)
    _metadata(w, s, mix)
    for t in plan:
        values, size = GGML_QUANT_SIZES[t.qtype]
        nbytes = int(np.prod(t.shape)) // values * size
        if t.qtype in FLOATS:
            w.add_tensor_info(t.name, t.shape, np.dtype(FLOATS[t.qtype]), nbytes)
        else:
            w.add_tensor_info(t.name, (t.shape[0], t.shape[1] // values * size), np.dtype(np.uint8), nbytes, raw_dtype=t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pools: dict[T, BlockPool] = {}
    done = 0
    for t in plan:
        data = _fill(t, pools, rng)
        w.write_tensor_data(data)
        done += data.nbytes
        if progress is not None:
            progress(t.name, done)
    w.close()
    return path
