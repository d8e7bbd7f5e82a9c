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
# fp16 out (q8_0 / q4_0): flat's loads; the integer code is or-ed into the exponent of 1024 as int16 bits
# (an exact fp16 1024 + code), then one fp16 subtract and one fp16 multiply by the block scale: no I2F,
# no fp32 round trip, and the dot runs in fp16 (the launcher's DOT). Only for 16-bit queries (launch_config)
DEQ_HALF = tl.constexpr(3)
# "half" numerics from 32-bit words (q8_0): [N, D/4] int32 loads, each word's four codes unpacked by
# shifts and joined back to [N, D]; the joins keep the dequantization in the load's layout, so the
# fp16 tile reaches tl.dot through shared memory (ldmatrix) instead of byte-wise loads
DEQ_WORDS = tl.constexpr(4)
DEQ_IDS = {"blocks_fast": 1, "flat": 2, "half": 3, "words": 4}


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
        if DEQ == DEQ_WORDS and FMT != 3:  # q8_0: D / 4 words a row, q4_0: D / 8
            WPR: tl.constexpr = D // 4 if FMT == 1 else D // 8
            words = code_ptr.to(tl.pointer_type(tl.int32))
            a = tl.load(words + row[:, None] * WPR + tl.arange(0, WPR)[None, :], mask=ok[:, None], other=0)
        elif DEQ == DEQ_FLAT or DEQ == DEQ_HALF or DEQ == DEQ_WORDS:
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
def _half_from_bits(u, BIAS: tl.constexpr):
    """Exact fp16 u + 1024 - BIAS for int16 0 <= u < 1024: u or-ed into 1024's bit pattern (0x6400, an
    exponent whose unit in the last place is 1), then one fp16 subtract (exact: an integer below 2048)."""
    return (u | 0x6400).to(tl.float16, bitcast=True) - BIAS


@triton.jit
def _word_to_halves(a, ASM: tl.constexpr):
    """int32 words of four int8 codes -> four exact fp16 tensors (byte 0 first). ASM: one xor, two
    byte permutes and two packed subtracts per word (the codes + 128 placed under 1024's exponent);
    else the same numbers from shifts (the interpreter runs no inline PTX)."""
    if ASM:
        h = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t, lo, hi, c;
            xor.b32 t, $4, 0x80808080;
            prmt.b32 lo, t, 0x64646464, 0x7170;
            prmt.b32 hi, t, 0x64646464, 0x7372;
            mov.b32 c, 0x64806480;
            sub.f16x2 lo, lo, c;
            sub.f16x2 hi, hi, c;
            mov.b32 {$0, $1}, lo;
            mov.b32 {$2, $3}, hi;
            }""",
            constraints="=h,=h,=h,=h,r", args=[a], dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=1)
        b0, b1, b2, b3 = h[0], h[1], h[2], h[3]
    else:
        b0 = _half_from_bits(((a & 0xFF) ^ 0x80).to(tl.int16), 1152.0)
        b1 = _half_from_bits((((a >> 8) & 0xFF) ^ 0x80).to(tl.int16), 1152.0)
        b2 = _half_from_bits((((a >> 16) & 0xFF) ^ 0x80).to(tl.int16), 1152.0)
        b3 = _half_from_bits((((a >> 24) & 0xFF) ^ 0x80).to(tl.int16), 1152.0)
    return b0, b1, b2, b3


@triton.jit
def _word_to_nibble_halves(a, ASM: tl.constexpr):
    """int32 words of eight q4_0 nibbles -> eight exact fp16 tensors (nibble - 8): the low nibbles of
    bytes 0..3, then the high nibbles. ASM: per pair of nibbles 16 bits apart, a shift, one lop3
    (mask, or 1024's exponent) and a packed subtract."""
    if ASM:
        h = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t, r0, r1, r2, r3, c;
            mov.b32 c, 0x64086408;
            lop3.b32 r0, $8, 0x000F000F, 0x64006400, 0xEA;
            shr.u32 t, $8, 8;
            lop3.b32 r1, t, 0x000F000F, 0x64006400, 0xEA;
            shr.u32 t, $8, 4;
            lop3.b32 r2, t, 0x000F000F, 0x64006400, 0xEA;
            shr.u32 t, $8, 12;
            lop3.b32 r3, t, 0x000F000F, 0x64006400, 0xEA;
            sub.f16x2 r0, r0, c;
            sub.f16x2 r1, r1, c;
            sub.f16x2 r2, r2, c;
            sub.f16x2 r3, r3, c;
            mov.b32 {$0, $2}, r0;
            mov.b32 {$1, $3}, r1;
            mov.b32 {$4, $6}, r2;
            mov.b32 {$5, $7}, r3;
            }""",
            constraints="=h,=h,=h,=h,=h,=h,=h,=h,r", args=[a],
            dtype=(tl.float16,) * 8, is_pure=True, pack=1)
        lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3 = h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
    else:
        lo0 = _half_from_bits((a & 15).to(tl.int16), 1032.0)
        lo1 = _half_from_bits(((a >> 8) & 15).to(tl.int16), 1032.0)
        lo2 = _half_from_bits(((a >> 16) & 15).to(tl.int16), 1032.0)
        lo3 = _half_from_bits(((a >> 24) & 15).to(tl.int16), 1032.0)
        hi0 = _half_from_bits(((a >> 4) & 15).to(tl.int16), 1032.0)
        hi1 = _half_from_bits(((a >> 12) & 15).to(tl.int16), 1032.0)
        hi2 = _half_from_bits(((a >> 20) & 15).to(tl.int16), 1032.0)
        hi3 = _half_from_bits(((a >> 28) & 15).to(tl.int16), 1032.0)
    return lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3


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
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, DEQ: tl.constexpr, ASM: tl.constexpr = False,
):
    """_load_raw's bytes -> [N, D] fp32 (DEQ_HALF with q8_0 / q4_0: fp16; tq3_0: rotated domain), in the
    format's unpack order (`_columns`)."""
    NB: tl.constexpr = D // 32
    if FMT == 0:
        x = a.to(tl.float32)
    elif DEQ == DEQ_WORDS and FMT == 1:  # byte j of word i is value 4i + j
        s2 = tl.reshape(tl.broadcast_to(s[:, :, None], (N, NB, 32)), (N, D))
        b0, b1, b2, b3 = _word_to_halves(a, ASM)
        x = tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (N, D)) * s2
    elif DEQ == DEQ_WORDS and FMT == 2:  # word i of a block: low nibbles are values 4i..4i+3, high 4i+16..4i+19
        s2 = tl.reshape(tl.broadcast_to(s[:, :, None], (N, NB, 32)), (N, D))
        lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3 = _word_to_nibble_halves(a, ASM)
        even = tl.join(tl.join(lo0, hi0), tl.join(lo2, hi2))
        odd = tl.join(tl.join(lo1, hi1), tl.join(lo3, hi3))
        x = tl.reshape(tl.join(even, odd), (N, D)) * s2  # word w's values at 8w..8w+7: lo0..lo3, hi0..hi3
    elif (DEQ == DEQ_HALF or DEQ == DEQ_WORDS) and FMT != 3:
        s2 = tl.reshape(tl.broadcast_to(s[:, :, None], (N, NB, 32)), (N, D))  # fp16
        if FMT == 1:  # code + 128 in 0..255
            x = _half_from_bits(a.to(tl.int16) + 128, 1152.0) * s2
        else:
            w = (tl.arange(0, D) % 32)[None, :]
            x = _half_from_bits((a.to(tl.int16) >> (4 * (w // 16)).to(tl.int16)) & 15, 1032.0) * s2
    elif DEQ == DEQ_FLAT or DEQ == DEQ_HALF or DEQ == DEQ_WORDS:
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
    """Original column of each unpacked column: q4_0 (blocks_fast) unpacks value j + 16h of a block at
    2j + h, q4_0 (words) as _word_to_nibble_halves orders them."""
    n = tl.arange(0, D)
    if FMT == 2 and DEQ == DEQ_BLOCKS_FAST:
        n = (n // 32) * 32 + (n % 32) // 2 + 16 * (n % 2)
    elif FMT == 2 and DEQ == DEQ_WORDS:  # unpacked 8w + r: word w % 4 of block w // 4, nibble r
        w = n // 8
        r = n % 8
        n = (w // 4) * 32 + (w % 4) * 4 + r % 4 + 16 * (r // 4)
    return n
