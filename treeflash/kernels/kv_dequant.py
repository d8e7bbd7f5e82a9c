"""How compressed K/V blocks become floats in registers, for the attention kernels
(kernels/quant_attention.py): loading a block's raw bytes and scales, and dequantizing them, per
format (q8_0, q4_0, tq3_0; dense types pass through) and per scheme (constexpr DEQ).

Block layouts: kernels/kv_formats.py and DESIGN.md. The plain-torch inverse is
kv_formats.dequantize, which the attention references use.
"""

from __future__ import annotations

import triton
import triton.language as tl


# Dequantization schemes (constexpr DEQ; LaunchConfig.dequant names them). Two more were measured
# on the H200 and removed (docs/kv.md): "blocks" (I2F conversions, a select chain for tq3_0: no
# faster) and "scaled" (raw codes into per-block batched dots, scales after: slower everywhere).
DEQ_BLOCKS_FAST = tl.constexpr(1)  # whole blocks ([N, D/32, bytes]) unpacked with join/reshape; ints -> float by the 2^23 trick, tq3_0 centroids by a cubic
DEQ_FLAT = tl.constexpr(2)  # 2-D [N, D] loads (column d reads the byte that holds value d), no reshape of codes
DEQ_IDS = {"blocks_fast": 1, "flat": 2}


@triton.jit
def _load_raw(scale_ptr, code_ptr, keys, kvh, num_kv_heads, ok, FMT: tl.constexpr, D: tl.constexpr, DEQ: tl.constexpr):
    """The stored bytes of rows `keys` [N] (int64) of KV head kvh: (codes, more codes, scales).
    DEQ_FLAT: [N, D] codes, column d holding the byte that value d needs (one byte serves 2 to
    8 columns: repeated addresses hit L1), and [N, D/32] scales. Else blocks are loaded whole
    ([N, D/32, bytes] codes, [N, D/32] scales): no per-value gathers."""
    NB: tl.constexpr = D // 32
    row = keys * num_kv_heads + kvh
    if FMT == 0:
        d = tl.arange(0, D)
        a = tl.load(code_ptr + row[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        b = ok
        s = ok
    else:
        s = tl.load(scale_ptr + row[:, None] * NB + tl.arange(0, NB)[None, :], mask=ok[:, None], other=0.0)
        b = ok
        if DEQ == DEQ_FLAT:
            d = tl.arange(0, D)
            blk, w, m2 = (d // 32)[None, :], (d % 32)[None, :], ok[:, None]
            if FMT == 1:
                a = tl.load(code_ptr + row[:, None] * D + d[None, :], mask=m2, other=0)
            elif FMT == 2:  # value j + 16h of a block: byte j, nibble h
                a = tl.load(code_ptr + row[:, None] * (D // 2) + blk * 16 + w % 16, mask=m2, other=0)
            else:  # magnitude: byte w // 4, bits 2 * (w % 4); sign: byte 8 + w // 8, bit w % 8
                base = code_ptr + row[:, None] * (NB * 12) + blk * 12
                a = tl.load(base + w // 4, mask=m2, other=0)
                b = tl.load(base + 8 + w // 8, mask=m2, other=0)
        else:
            r3, m3, b3 = row[:, None, None], ok[:, None, None], tl.arange(0, NB)[None, :, None]
            if FMT == 1:
                a = tl.load(code_ptr + r3 * D + b3 * 32 + tl.arange(0, 32)[None, None, :], mask=m3, other=0)
            elif FMT == 2:
                a = tl.load(code_ptr + r3 * (D // 2) + b3 * 16 + tl.arange(0, 16)[None, None, :], mask=m3, other=0)
            else:
                base = code_ptr + r3 * (NB * 12) + b3 * 12
                a = tl.load(base + tl.arange(0, 8)[None, None, :], mask=m3, other=0)
                b = tl.load(base + 8 + tl.arange(0, 4)[None, None, :], mask=m3, other=0)
    return a, b, s


@triton.jit
def _load_q8_blocks(scale_ptr, code_ptr, keys, kvh, num_kv_heads, ok, D: tl.constexpr):
    """q8_0 rows `keys` [N] of KV head kvh, for int8 dots (LaunchConfig.k_int8): a tuple of D/32
    raw code tiles [N, 32] int8 and a tuple of D/32 scale vectors [N] fp16, one per block along
    head_dim (tuples, because a Triton tensor cannot be sliced by block)."""
    NB: tl.constexpr = D // 32
    row = keys * num_kv_heads + kvh
    codes = ()
    scales = ()
    for blk in tl.static_range(NB):
        codes = codes + (tl.load(code_ptr + row[:, None] * D + blk * 32 + tl.arange(0, 32)[None, :], mask=ok[:, None], other=0),)
        scales = scales + (tl.load(scale_ptr + row * NB + blk, mask=ok, other=0.0),)
    return codes, scales


@triton.jit
def _int_to_float(x, BIAS: tl.constexpr):
    """Exact int32 -> fp32 minus BIAS for 0 <= x < 2^22 (x | 2^23's exponent, then subtract):
    two full-rate ops instead of a quarter-rate I2F."""
    return (x | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + BIAS)


@triton.jit
def _tq3_value(mag, neg, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    """+-C[mag] (neg = 1: negative) by arithmetic: the cubic through (m, C_m), m = 0..3, and the
    sign bit xor-ed in."""
    P1: tl.constexpr = (-11 * C0 + 18 * C1 - 9 * C2 + 2 * C3) / 6
    P2: tl.constexpr = (2 * C0 - 5 * C1 + 4 * C2 - C3) / 2
    P3: tl.constexpr = (-C0 + 3 * C1 - 3 * C2 + C3) / 6
    m = _int_to_float(mag, 0.0)
    c = ((P3 * m + P2) * m + P1) * m + C0
    return (c.to(tl.int32, bitcast=True) ^ (neg << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _dequant(
    a, b, s, FMT: tl.constexpr, N: tl.constexpr, D: tl.constexpr,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, DEQ: tl.constexpr,
):
    """_load_raw's bytes -> [N, D] fp32 (tq3_0: rotated domain), in the format's unpack order (`_columns`)."""
    NB: tl.constexpr = D // 32
    if FMT == 0:
        x = a.to(tl.float32)
    elif DEQ == DEQ_FLAT:
        w = (tl.arange(0, D) % 32)[None, :]
        if FMT == 1:
            q = _int_to_float(a.to(tl.int32) + 128, 128.0)
        elif FMT == 2:
            q = _int_to_float((a.to(tl.int32) >> (4 * (w // 16))) & 15, 8.0)
        else:
            q = _tq3_value((a.to(tl.int32) >> (2 * (w % 4))) & 3, (b.to(tl.int32) >> (w % 8)) & 1, C0, C1, C2, C3)
        s2 = tl.broadcast_to(s.to(tl.float32)[:, :, None], (N, NB, 32))
        x = q * tl.reshape(s2, (N, D))
    else:  # DEQ_BLOCKS_FAST
        if FMT == 1:
            q = _int_to_float(a.to(tl.int32) + 128, 128.0)
        elif FMT == 2:  # byte j: value j (low nibble), value j + 16 (high); unpacked as (j, nibble)
            a = a.to(tl.int32)
            q = _int_to_float(tl.reshape(tl.join(a & 15, a >> 4), (N, NB, 32)), 8.0)
        else:  # byte i < 8: magnitudes of values 4i..4i+3; byte 8 + i: signs of values 8i..8i+7
            bm, bs = a.to(tl.int32), b.to(tl.int32)
            mag = tl.reshape((bm[:, :, :, None] >> (2 * tl.arange(0, 4))[None, None, None, :]) & 3, (N, NB, 32))
            neg = tl.reshape((bs[:, :, :, None] >> tl.arange(0, 8)[None, None, None, :]) & 1, (N, NB, 32))
            q = _tq3_value(mag, neg, C0, C1, C2, C3)
        x = tl.reshape(q * s.to(tl.float32)[:, :, None], (N, D))
    return x


@triton.jit
def _columns(FMT: tl.constexpr, D: tl.constexpr, DEQ: tl.constexpr):
    """Original column of each unpacked column: q4_0 unpacks value j + 16h of a block at 2j + h."""
    n = tl.arange(0, D)
    if FMT == 2 and DEQ != DEQ_FLAT:
        n = (n // 32) * 32 + (n % 32) // 2 + 16 * (n % 2)
    return n
