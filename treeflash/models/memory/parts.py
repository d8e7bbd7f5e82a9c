"""Bytes of each buffer the stack allocates, as pure functions of shapes (no tensor is created).

Each function mirrors one allocation site and says which; tests/models/test_plan.py checks the KV
and recurrent ones against the buffers a real ModelCache allocates.
"""

from __future__ import annotations

from treeflash.kernels.kv import kv_formats as formats
from treeflash.models.config import ModelConfig

LONG_BYTES = 8
FP32_BYTES = 4


def kv_row_bytes(cache_type: str, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """One token's K (or V) in one attention layer, all KV heads (kv/quantized.py `_Rows`,
    kv/attention_cache.py `DenseAttentionCache`): a compressed row keeps an fp16 scale per 32 values."""
    if cache_type == formats.AUTO:
        return num_kv_heads * head_dim * dtype_bytes
    return num_kv_heads * formats.get_format(cache_type).row_bytes(head_dim)


def is_compressed(cache_type: str) -> bool:
    return cache_type != formats.AUTO and not formats.get_format(cache_type).is_dense


def attention_kv_bytes(config: ModelConfig, max_len: int, cache_type_k: str, cache_type_v: str, dtype_bytes: int,
                       k_exact_layers: int = 0) -> tuple[int, int]:
    """(K bytes, V bytes) of a ModelCache of `max_len` slots over the model's attention layers; the first
    `k_exact_layers` store K at the runtime dtype (kv/cache.py)."""
    h, d = config.num_kv_heads, config.head_dim
    n = len(config.attention_layer_ids)
    exact = min(k_exact_layers, n)
    k = exact * kv_row_bytes(formats.AUTO, h, d, dtype_bytes) + (n - exact) * kv_row_bytes(cache_type_k, h, d, dtype_bytes)
    v = n * kv_row_bytes(cache_type_v, h, d, dtype_bytes)
    return k * max_len, v * max_len


def key_offset_bytes(config: ModelConfig, cache_type_k: str, cache_type_v: str, k_exact_layers: int = 0,
                     center_keys: bool = True) -> int:
    """Compressed K layers keep an fp32 key offset [Hkv, D] each (kv/quantized.py `key_offset`); a layer
    is quantized (QuantizedAttentionCache) when either of its K and V types is compressed."""
    if not center_keys:
        return 0
    n = len(config.attention_layer_ids)
    compressed_k = n - min(k_exact_layers, n) if is_compressed(cache_type_k) else 0
    return compressed_k * config.num_kv_heads * config.head_dim * FP32_BYTES


def rotation_bytes(config: ModelConfig, cache_type_k: str, cache_type_v: str, rotate_keys: bool = True) -> int:
    """The Hadamard rotation kv_formats.tq3_rotation keeps once per device (fp32 [g, g], g = min(128, D))
    when tq3_0 or rotated q8_0/q4_0 keys are in use."""
    rotated = "tq3_0" in (cache_type_k, cache_type_v) or (rotate_keys and cache_type_k in ("q8_0", "q4_0"))
    if not rotated or not config.attention_layer_ids:
        return 0
    g = min(formats.TQ3_GROUP, config.head_dim)
    return g * g * FP32_BYTES


def conv_dim(config: ModelConfig) -> int:
    return 2 * config.linear_num_key_heads * config.linear_key_head_dim + config.linear_num_value_heads * config.linear_value_head_dim


def recurrent_state_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """Per Gated DeltaNet layer (kv/recurrent_cache.py): the conv window [conv_dim, K - 1] in the runtime
    dtype and the delta-rule state [Hv, Dk, Dv] fp32."""
    c = config
    per_layer = conv_dim(c) * (c.linear_conv_kernel_dim - 1) * dtype_bytes
    per_layer += c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * FP32_BYTES
    return len(c.linear_layer_ids) * per_layer


def pending_node_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """Per verify node, over every DeltaNet layer (kv/recurrent_cache.py `PendingNodes`): the conv input
    row (dtype), the conv output row (fp32) and the two gate inputs (dtype)."""
    c = config
    per_layer = conv_dim(c) * (dtype_bytes + FP32_BYTES) + 2 * c.linear_num_value_heads * dtype_bytes
    return len(c.linear_layer_ids) * per_layer


def rope_table_bytes(rotary_dim: int, positions: int, dtype_bytes: int) -> int:
    """models/layers.py `Rotary.reserve`: cos and sin stacked, [2, positions, rotary_dim] in dtype."""
    return 2 * positions * rotary_dim * dtype_bytes


def layer_width(config: ModelConfig, gdn_factor: float = 1.0) -> int:
    """Values per token of the widest layer's temporaries: its input projections and output, and the
    MLP's gate|up, activation and output (models/attention.py, models/gated_deltanet.py, layers.py MLP).
    gdn_factor scales the Gated DeltaNet block's count (its projections, conv output, z and gates) to
    the chunked delta rule's measured peak (Overheads.gdn_temporaries_factor)."""
    c = config
    q = c.num_heads * c.head_dim * (2 if c.attn_output_gate else 1)
    attention = q + 2 * c.num_kv_heads * c.head_dim + c.num_heads * c.head_dim
    gdn = 0
    if c.is_hybrid:
        z = c.linear_num_value_heads * c.linear_value_head_dim
        gdn = int((conv_dim(c) * 3 + 2 * z + 2 * c.linear_num_value_heads) * gdn_factor)  # projections, conv output (fp32), z, gates
    return max(attention, gdn) + 3 * c.intermediate_size + 4 * c.hidden_size


def attention_layer_width(config: ModelConfig) -> int:
    """Values per token an attention layer holds while it attends (models/attention.py): its q (and output
    gate), k, v, output and the residual stream; the MLP's temporaries come after the attention is freed."""
    c = config
    q = c.num_heads * c.head_dim * (2 if c.attn_output_gate else 1)
    return q + 2 * c.num_kv_heads * c.head_dim + c.num_heads * c.head_dim + 4 * c.hidden_size


def activation_bytes(config: ModelConfig, num_tokens: int, logit_rows: int, dtype_bytes: int, gdn_factor: float = 1.0) -> int:
    """Temporaries of one forward over `num_tokens` tokens with logits for `logit_rows` of them (the head
    computes in dtype, CausalLM returns fp32). Overheads.activation_factor scales it to the measured peak."""
    return num_tokens * layer_width(config, gdn_factor) * dtype_bytes + logit_rows * config.vocab_size * (dtype_bytes + FP32_BYTES)


# Bytes per value that kv_formats.dequantize_* hold at their peak, the fp32 result included, counted from
# the reference code: q8_0 the fp32 codes and the product; q4_0 the unpacked nibbles, their fp32 copy and
# the product; tq3_0 the unpacked codes, their int64 index and the gathered centroids (then the sign and
# the un-rotation's fp32 copies).
DEQUANT_PEAK_BYTES = {"q8_0": 8, "q4_0": 9, "tq3_0": 16}
DEQUANT_ROWS = 16384  # kv/quantized.py DEQUANT_ROWS: rows of one KV head a prefill read dequantizes at once


def dequantized_kv_bytes(config: ModelConfig, max_len: int, cache_type_k: str, cache_type_v: str, dtype_bytes: int) -> int:
    """A prefill chunk over a compressed cache reads one layer's K rows, then its V rows, dequantized
    (kv/quantized.py `read`: fp32, then the runtime dtype): at the peak K in dtype, V's dequantize
    temporaries and V in dtype. Dense rows at the runtime dtype are read in place."""
    if not (is_compressed(cache_type_k) or is_compressed(cache_type_v)):
        return 0

    def out_bytes(t: str) -> int:  # bytes per value of the rows as attention reads them (0: read in place)
        if t == formats.AUTO:
            return 0
        f = formats.get_format(t)
        return 0 if f.is_dense and f.block_bytes == formats.BLOCK * dtype_bytes else dtype_bytes

    tmp = max(DEQUANT_PEAK_BYTES.get(cache_type_k, 0), DEQUANT_PEAK_BYTES.get(cache_type_v, 0))
    rows = max_len * config.num_kv_heads * config.head_dim
    return rows * (out_bytes(cache_type_k) + out_bytes(cache_type_v) + tmp)


def prefill_kv_read_bytes(config: ModelConfig, max_len: int, cache_type_k: str, cache_type_v: str, dtype_bytes: int,
                          dequant_rows: int = DEQUANT_ROWS) -> int:
    """The rows the last prefill chunk's attention holds over the whole prefix. A compressed cache
    (kv/quantized.py `_prefill_attention`) reads one KV head's K and V rows at a time in the runtime
    dtype, dequantized `dequant_rows` rows at a time, one query head per SDPA call. A dense cache
    (kv/attention_cache.py `new_token_attention`) reads its rows in place, and under grouped-query
    attention repeats one KV head's rows for its query heads (SDPA's fused causal kernels take no GQA)."""
    if is_compressed(cache_type_k) or is_compressed(cache_type_v):
        head_rows = max_len * config.head_dim  # values of one KV head's K (or V)
        tmp = max(DEQUANT_PEAK_BYTES.get(cache_type_k, 0), DEQUANT_PEAK_BYTES.get(cache_type_v, 0))
        return 2 * head_rows * dtype_bytes + min(max_len, dequant_rows) * config.head_dim * tmp
    dequant = dequantized_kv_bytes(config, max_len, cache_type_k, cache_type_v, dtype_bytes)
    group = config.num_heads // config.num_kv_heads
    if group == 1:
        return dequant
    rows = max_len * config.num_kv_heads * config.head_dim * dtype_bytes  # one of K / V in the runtime dtype
    held = rows * (int(is_compressed(cache_type_k)) + int(is_compressed(cache_type_v)))  # dense rows are read in place
    return max(dequant, held + 2 * rows * group // config.num_kv_heads)


def verify_graph_outputs(config: ModelConfig, nodes: int, capture_width: int, dtype_bytes: int) -> int:
    """What one captured verify graph of `nodes` nodes keeps (models/runner.py `_Graph`): logits [T, vocab]
    fp32 and their argmax, the captured drafter features [T, C], and every DeltaNet layer's pending rows."""
    return nodes * (config.vocab_size * FP32_BYTES + LONG_BYTES + capture_width * dtype_bytes + pending_node_bytes(config, dtype_bytes))
