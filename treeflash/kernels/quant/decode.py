"""Dequantization in registers, one group of a block at a time: the part every quant kernel shares.

A group is S consecutive weights of a block that share one scale (and one min): S = 16 or 32, G
groups per block. `group(FMT, ...)` returns, for BLOCK_N rows at once, the group's codes q [BLOCK_N, S]
and its per-row scale and min, so that the weights are w = scale * q + min (MIN_MODE 1: Q4_1, Q5_1)
or w = scale * q - min (MIN_MODE -1: the K-quants' dmin), as ggml writes them (an add and a
subtract round a zero's sign differently, and the dequantizer is bit for bit), min = 0 without one. q is an exact small integer (|q| <= 128), so it is exact in bf16/fp16 too and a
kernel may take the dot product of q with x on tensor cores and apply the scale after.

Byte offsets follow ggml's block structs (reference.py spells the same layouts in plain torch);
element e of a 256-value block is e = c * 128 + s * 32 + j where the bits are packed that way.
`base` is each row's byte offset of the current block ([BLOCK_N] int64); B the blocks as uint8, H
the same memory as fp16 (every block size and fp16 field offset is even).
"""

from __future__ import annotations

import triton
import triton.language as tl

from treeflash.kernels.quant.formats import FORMATS

# per format: (group size S, groups per block G, MIN_MODE: 0 none, 1 w = scale*q + min, -1 w = scale*q - min)
GROUPS: dict[str, tuple[int, int, int]] = {
    "Q4_0": (16, 2, 0), "Q4_1": (16, 2, 1), "Q5_0": (16, 2, 0), "Q5_1": (16, 2, 1),
    "Q8_0": (32, 1, 0), "IQ4_NL": (16, 2, 0),
    "Q2_K": (16, 16, -1), "Q3_K": (16, 16, 0), "Q4_K": (32, 8, -1), "Q5_K": (32, 8, -1),
    "Q6_K": (16, 16, 0), "IQ4_XS": (16, 16, 0),
}
FMT_ID = {name: FORMATS[name].ggml_type for name in GROUPS}

# IQ4 levels + 128 (ggml's kvalues_iq4nl), four 16-bit fields per int64: no table in memory
_IQ4_A = tl.constexpr(0x3f002d00180001)
_IQ4_B = tl.constexpr(0x76006a005d004f)
_IQ4_C = tl.constexpr(0xa60099008d0081)
_IQ4_D = tl.constexpr(0xf100d900c500b5)


@triton.jit
def _f16(H, byte_off):
    """The fp16 at byte_off (even) of each row, as fp32 ([BLOCK_N])."""
    return tl.load(H + byte_off // 2).to(tl.float32)


@triton.jit
def _bytes(B, base, start, i):
    """[BLOCK_N, S] int32: bytes start + i of each row's block."""
    return tl.load(B + base[:, None] + (start + i)[None, :]).to(tl.int32)


@triton.jit
def _byte(B, byte_off):
    return tl.load(B + byte_off).to(tl.int32)


@triton.jit
def _iq4_level(q):
    """IQ4 code (0..15, int32) -> its level (fp32), by a 3-select lookup in packed constants."""
    q64 = q.to(tl.int64)
    t = tl.where(q64 < 8, tl.where(q64 < 4, _IQ4_A, _IQ4_B), tl.where(q64 < 12, _IQ4_C, _IQ4_D))
    return (((t >> ((q64 & 3) * 16)) & 0xFFFF) - 128).to(tl.float32)


@triton.jit
def group(FMT: tl.constexpr, B, H, base, g: tl.constexpr, S: tl.constexpr):
    """Group g of each row's block at byte offset base: (q [BLOCK_N, S] fp32, scale [BLOCK_N] fp32,
    min [BLOCK_N] fp32) with w = scale * q +/- min (GROUPS' MIN_MODE)."""
    i = tl.arange(0, S)
    zero = base.to(tl.float32) * 0.0
    if FMT == 2:  # Q4_0: d, 16 bytes; group g = the low (0) or high (1) nibbles
        q = ((_bytes(B, base, 2, i) >> (4 * g)) & 15) - 8
        q, scale, mn = q.to(tl.float32), _f16(H, base), zero
    elif FMT == 3:  # Q4_1: d, m, 16 bytes
        q = (_bytes(B, base, 4, i) >> (4 * g)) & 15
        q, scale, mn = q.to(tl.float32), _f16(H, base), _f16(H, base + 2)
    elif FMT == 6:  # Q5_0: d, qh (bit e of a uint32), 16 bytes
        hb = (_bytes(B, base, 2 + 2 * g, i // 8) >> (i % 8)[None, :]) & 1
        q = (((_bytes(B, base, 6, i) >> (4 * g)) & 15) | (hb << 4)) - 16
        q, scale, mn = q.to(tl.float32), _f16(H, base), zero
    elif FMT == 7:  # Q5_1: d, m, qh, 16 bytes
        hb = (_bytes(B, base, 4 + 2 * g, i // 8) >> (i % 8)[None, :]) & 1
        q = ((_bytes(B, base, 8, i) >> (4 * g)) & 15) | (hb << 4)
        q, scale, mn = q.to(tl.float32), _f16(H, base), _f16(H, base + 2)
    elif FMT == 8:  # Q8_0: d, 32 int8
        q = tl.load(B + base[:, None] + (2 + i)[None, :]).to(tl.int8, bitcast=True)
        q, scale, mn = q.to(tl.float32), _f16(H, base), zero
    elif FMT == 20:  # IQ4_NL: d, 16 bytes of 4-bit codes into the levels
        q = _iq4_level((_bytes(B, base, 2, i) >> (4 * g)) & 15)
        q, scale, mn = q, _f16(H, base), zero
    elif FMT == 10:  # Q2_K: 16 scale bytes (low: scale, high: min), 64 bytes of 2-bit codes, d, dmin
        c = g // 8
        s = (g % 8) // 2
        q = (_bytes(B, base, 16 + c * 32 + (g % 2) * 16, i) >> (2 * s)) & 3
        sc = _byte(B, base + g)
        q, scale, mn = q.to(tl.float32), _f16(H, base + 80) * (sc & 15).to(tl.float32), _f16(H, base + 82) * (sc >> 4).to(tl.float32)
    elif FMT == 11:  # Q3_K: hmask 32, 2-bit codes 64, 12 bytes of 6-bit scales, d
        c = g // 8
        s = (g % 8) // 2
        j0 = (g % 2) * 16
        low = (_bytes(B, base, 32 + c * 32 + j0, i) >> (2 * s)) & 3
        hm = (_bytes(B, base, j0, i) >> (c * 4 + s)) & 1
        q = low - ((hm ^ 1) << 2)  # the high bit set means no -4 offset
        if g < 8:
            sl = _byte(B, base + 96 + g) & 15
        else:
            sl = _byte(B, base + 96 + g - 8) >> 4
        sh = (_byte(B, base + 104 + g % 4) >> (2 * (g // 4))) & 3
        q, scale, mn = q.to(tl.float32), _f16(H, base + 108) * ((sl | (sh << 4)) - 32).to(tl.float32), zero
    elif FMT == 12 or FMT == 13:  # Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit scales and mins, [qh 32,] codes
        if g < 4:
            sc6 = _byte(B, base + 4 + g) & 63
            m6 = _byte(B, base + 8 + g) & 63
        else:
            sc6 = (_byte(B, base + 8 + g) & 15) | ((_byte(B, base + g) >> 6) << 4)
            m6 = (_byte(B, base + 8 + g) >> 4) | ((_byte(B, base + 4 + g) >> 6) << 4)
        if FMT == 12:
            q = (_bytes(B, base, 16 + (g // 2) * 32, i) >> (4 * (g % 2))) & 15
        else:
            q = ((_bytes(B, base, 48 + (g // 2) * 32, i) >> (4 * (g % 2))) & 15) | (((_bytes(B, base, 16, i) >> g) & 1) << 4)
        q, scale, mn = q.to(tl.float32), _f16(H, base) * sc6.to(tl.float32), _f16(H, base + 2) * m6.to(tl.float32)
    elif FMT == 14:  # Q6_K: low 4 bits 128, high 2 bits 64, 16 int8 scales, d
        c = g // 8
        s = (g % 8) // 2
        j0 = (g % 2) * 16
        low = (_bytes(B, base, c * 64 + (s % 2) * 32 + j0, i) >> (4 * (s // 2))) & 15
        high = (_bytes(B, base, 128 + c * 32 + j0, i) >> (2 * s)) & 3
        q = (low | (high << 4)) - 32
        sc = tl.load(B + base + 192 + g).to(tl.int8, bitcast=True).to(tl.float32)
        q, scale, mn = q.to(tl.float32), _f16(H, base + 208) * sc, zero
    else:  # IQ4_XS (23): d, 2 bytes of high scale bits, 4 bytes of low scale nibbles, 128 bytes of codes
        gg = g // 2
        q = _iq4_level((_bytes(B, base, 8 + gg * 16, i) >> (4 * (g % 2))) & 15)
        sl = (_byte(B, base + 4 + gg // 2) >> (4 * (gg % 2))) & 15
        sh = (_byte(B, base + 2 + gg // 4) >> (2 * (gg % 4))) & 3
        q, scale, mn = q, _f16(H, base) * ((sl | (sh << 4)) - 32).to(tl.float32), zero
    return q, scale, mn
