"""The "split" dequantization of q4_0, tq3_0 and (opt-in, LaunchConfig.split_q8) q8_0 blocks for the
attention kernels (kernels/attention/quant_attention.py, DEQ_SPLIT): no join and no reshape of codes.

q.k and p.v sum over head_dim, so the channels may be visited in any order, as long as the query
(for K) or the output's store (for V) uses the same one. So the [N, D] tile is never rebuilt in
head_dim order: one load of a row's codes is dequantized elementwise, in the load's layout, into
fp16 tiles ("parts") of W columns, and part j's column c holds channel `_split_columns(FMT, D, j)[c]`:

- q4_0, four parts [N, D/4]: column c is halfword h = c % 8 of block c // 8 (bytes 2h, 2h + 1; byte j
  holds value j in its low nibble and j + 16 in its high one). Parts 0-3 = values 2h, 2h + 1, 2h + 16,
  2h + 17 (kv_dequant._halfword_to_nibble_halves, the "words" PTX, one input per halfword).
- q8_0 (only under LaunchConfig.split_q8: the split8_* variants), four parts [N, D/4]: column c is
  int32 word c of the row (block c // 8), part j its byte j, i.e. channel 4c + j (kv_dequant._word_to_halves,
  the "words" PTX, one input per word).
- tq3_0, eight parts [N, D/8]: column c is element k = c % 4 of block c // 4, one int32 holding
  magnitude bytes 2k, 2k + 1 (values 8k..8k+7, 2 bits each) and sign byte k (their signs: the low
  nibble is byte 2k's, the high one byte 2k + 1's). Part 4h + j = value 8k + 4h + j.

Scores are sum_j q_j . K_j^T, q_j [M, W] the query's channels of part j (loaded once per program); the
values accumulate in one [M, W] tile per part, out_j += p . V_j, each stored to its own channels. Each
part is scaled by its column's block scale in fp16 and both dots run in fp16 with fp32 accumulation:
the numerics of "words" (value = code x scale rounded once to fp16; tq3_0's centroids rounded to fp16),
which `split_planes_reference` gives in plain torch.

Every step from the shared-memory load to the dot is elementwise, and each inline asm has one input and
needs nothing but its own elements (no per-column constants, no assumption about which elements share
a register). Triton (3.6) then converts the codes, not the fp16 parts, to the MMA operand's layout: the
parts are dequantized where the dot reads them, with no shared-memory round trip. That is why tq3_0
uses eight narrower parts: with [N, D/4] columns (one magnitude byte each) a column's sign nibble sits
at a position that depends on the column, which takes either a per-column shift (Triton then keeps
the fp16 parts' round trip: 1,153-1,272 SASS instructions a step against 1,065, bench/kv_split_sass.py)
or a packed asm that assumes which columns share a register (wrong in the p.v operand's layout, where
a thread's neighbouring elements are keys).

Where a side runs "split" (attention_launch.split_fits): parts at least 16 wide (dot operands) for K,
and at least 8 x warps wide for V (narrower p.v_j dots replicate the MMAs across warps); a q8_0 side only
with LaunchConfig.split_q8. Else, and for an fp32 query, attention_launch._schemes falls back to "words"
(or the fp32 path). In the kernel, DEQ_SPLIT with FMT 1 (q8_0) means q8_0 split: _schemes decides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.kv import kv_formats as formats
from treeflash.kernels.kv.kv_dequant import (
    DEQ_SPLIT, _columns, _halfword_to_nibble_halves, _load_raw, _tq3_half, _word_to_halves,
)
from treeflash.kernels.kv.kv_quant import Planes

# tq3_0, two elements per asm instance (pack=2), one input (a "unary" asm: Triton may then run it in the
# dot operand's layout, with no shared-memory round trip of the fp16 parts). Element k of a block holds
# magnitude bytes 2k (bits 0-7) and 2k + 1 (bits 8-15) and sign byte k (bits 16-23), i.e. values 8k..8k+7
# with their signs. Out: $r for part r = 4h + j, the fp16 pair (element 0, element 1) of value
# 8k + 4h + j. m gathers the four magnitude bytes (element 0's even, element 1's even, element 0's odd,
# element 1's odd); as in kv_dequant._tq3_quad, each 2-bit index becomes a prmt selector (m, 4 + m)
# into the centroids' fp16 low- and high-byte tables (lo, an immediate hi). sa holds element 0's sign
# byte at bits 0-7 and element 1's at bits 16-23 (sb = sa >> 4: their high nibbles at bits 0-3 and
# 16-19), so one shift brings part (h, j)'s two sign bits to fp16 bits 15 and 31, and a lop3 xors them
# in (a ^ (b & c): 0x78).
def _tq3_split_asm() -> str:
    import struct

    halves = [struct.unpack("<H", struct.pack("<e", c))[0] for c in formats.TQ3_CENTROIDS]
    lo = sum((h & 0xFF) << (8 * i) for i, h in enumerate(halves))
    hi = sum((h >> 8) << (8 * i) for i, h in enumerate(halves))
    head = f"""{{
    .reg .b32 t, m, sel, sa, sb, x, lo;
    mov.b32 lo, {lo:#010x};
    prmt.b32 m, $8, $9, 0x5140;
    prmt.b32 sa, $8, $9, 0x6622;
    shr.b32 sb, sa, 4;"""
    part = """
    shr.b32 t, m, {sh};
    and.b32 t, t, 0x03030303;
    mad.lo.u32 sel, t, 17, 0x40404040;
    prmt.b32 ${even}, lo, {hi}, sel;
    shr.b32 sel, sel, 16;
    prmt.b32 ${odd}, lo, {hi}, sel;
    shl.b32 x, sa, {ss};
    lop3.b32 ${even}, ${even}, x, 0x80008000, 0x78;
    shl.b32 x, sb, {ss};
    lop3.b32 ${odd}, ${odd}, x, 0x80008000, 0x78;"""
    body = "".join(part.format(sh=2 * j, even=j, odd=4 + j, ss=15 - j, hi=f"{hi:#010x}") for j in range(4))
    return head + body + "\n}"


TQ3_SPLIT_ASM = tl.constexpr(_tq3_split_asm())


@triton.jit
def _split_load(scale_ptr, code_ptr, keys, kvh, num_kv_heads, ok, FMT: tl.constexpr, D: tl.constexpr):
    """Rows `keys` [N] (int64) of KV head kvh: (codes [N, W], scales [N, W] fp16: each column's block's),
    W = D/4 (q8_0, q4_0) or D/8 (tq3_0). q8_0: int32 word c of the row (block c // 8). q4_0: halfword c
    of the row (block c // 8). tq3_0: element k = c % 4 of block c // 4 as one int32: magnitude bytes 2k,
    2k + 1, then sign byte k (TQ3_SPLIT_ASM)."""
    NB: tl.constexpr = D // 32
    W: tl.constexpr = D // 8 if FMT == 3 else D // 4  # columns per part: q8_0 / q4_0 4 parts, tq3_0 8
    row = keys * num_kv_heads + kvh
    c = tl.arange(0, W)
    m2 = ok[:, None]
    s = tl.load(scale_ptr + row[:, None] * NB + tl.arange(0, NB)[None, :], mask=m2, other=0.0)  # [N, NB]
    s = tl.reshape(tl.broadcast_to(s[:, :, None], (s.shape[0], NB, W // NB)), (s.shape[0], W))
    if FMT == 1:  # [N, D/4] int32: four codes a word
        words = code_ptr.to(tl.pointer_type(tl.int32))
        a = tl.load(words + row[:, None] * W + c[None, :], mask=m2, other=0)
    elif FMT == 2:  # [N, D/4] int16: four nibbles a halfword
        words = code_ptr.to(tl.pointer_type(tl.int16))
        a = tl.load(words + row[:, None] * W + c[None, :], mask=m2, other=0)
    else:
        halves = code_ptr.to(tl.pointer_type(tl.uint16))  # a block: 6 halfwords, magnitudes in the first 4
        mag = tl.load(halves + row[:, None] * (NB * 6) + ((c // 4) * 6 + c % 4)[None, :], mask=m2, other=0)
        sgn = tl.load(code_ptr + row[:, None] * (NB * 12) + ((c // 4) * 12 + 8 + c % 4)[None, :], mask=m2, other=0)
        a = mag.to(tl.int32) | (sgn.to(tl.int32) << 16)
    return a, s


@triton.jit
def _tq3_parts(a, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, ASM: tl.constexpr):
    """_split_load's tq3_0 elements [N, D/8] -> eight fp16 tiles [N, D/8] +-C[m] (unscaled): part 4h + j
    = bits 2j, 2j + 1 of magnitude byte 2k + h, its sign bit 4h + j of sign byte k (value 8k + 4h + j)."""
    if ASM:
        h = tl.inline_asm_elementwise(asm=TQ3_SPLIT_ASM, constraints="=r," * 8 + "r,r", args=[a], dtype=(tl.float16,) * 8,
                                      is_pure=True, pack=2)
        parts = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])
    else:
        parts = ()
        for r in tl.static_range(8):
            m = (a >> (8 * (r // 4) + 2 * (r % 4))) & 3
            parts = parts + (_tq3_half(m, (a >> (16 + r)) & 1, C0, C1, C2, C3),)
    return parts


@triton.jit
def _split_parts(a, s, FMT: tl.constexpr, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
                 ASM: tl.constexpr):
    """_split_load's tiles -> the fp16 parts (a tuple: q8_0 / q4_0 four [N, D/4], tq3_0 eight [N, D/8]),
    each times its column's block scale; elementwise in the load's layout."""
    if FMT == 1:  # part j = byte j of each word: code + 128 under 1024's exponent, exact, then the scale
        b0, b1, b2, b3 = _word_to_halves(a, ASM)
        parts = (b0 * s, b1 * s, b2 * s, b3 * s)
    elif FMT == 2:
        v0, v1, v2, v3 = _halfword_to_nibble_halves(a, ASM)
        parts = (v0 * s, v1 * s, v2 * s, v3 * s)
    else:
        raw = _tq3_parts(a, C0, C1, C2, C3, ASM)
        parts = ()
        for r in tl.static_range(8):
            parts = parts + (raw[r] * s,)
    return parts


@triton.jit
def _split_columns(FMT: tl.constexpr, D: tl.constexpr, J: tl.constexpr):
    """[W]: the head_dim channel of each column of part J (W = D/4 (q8_0, q4_0) or D/8 (tq3_0))."""
    if FMT == 1:  # word c: values 4c..4c+3, byte J
        col = tl.arange(0, D // 4) * 4 + J
    elif FMT == 2:  # halfword h = c % 8 of block c // 8: values 2h, 2h + 1, 2h + 16, 2h + 17
        c = tl.arange(0, D // 4)
        col = (c // 8) * 32 + (c % 8) * 2 + (J % 2) + 16 * (J // 2)
    else:  # element k = c % 4 of block c // 4: value 8k + 4h + j, J = 4h + j
        c = tl.arange(0, D // 8)
        col = (c // 4) * 32 + (c % 4) * 8 + J
    return col


@triton.jit
def _split_zeros(BLOCK_M: tl.constexpr, FMT: tl.constexpr, D: tl.constexpr):
    """The accumulators of V's parts: a tuple of [BLOCK_M, W] fp32 zeros."""
    W: tl.constexpr = D // 8 if FMT == 3 else D // 4  # columns per part: q8_0 / q4_0 4 parts, tq3_0 8
    return (tl.zeros((BLOCK_M, W), tl.float32),) * (D // W)


@triton.jit
def _split_query(q_rows, row_ok, FMT: tl.constexpr, D: tl.constexpr):
    """The query's parts (a tuple of [BLOCK_M, W] fp16, K's channel order), loaded once per program."""
    NP: tl.constexpr = 8 if FMT == 3 else 4
    qp = ()
    for j in tl.static_range(NP):
        qp = qp + (tl.load(q_rows[:, None] + _split_columns(FMT, D, j)[None, :], mask=row_ok[:, None], other=0.0).to(tl.float16),)
    return qp


@triton.jit
def _split_scores(qp, a, s, FMT: tl.constexpr, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
                  ASM: tl.constexpr):
    """[BLOCK_M, BLOCK_N] fp32 q.k = sum over the parts of q_j . K_j^T (fp16 dots)."""
    kp = _split_parts(a, s, FMT, C0, C1, C2, C3, ASM)
    out = tl.dot(qp[0], tl.trans(kp[0]))
    for j in tl.static_range(1, len(kp)):
        out = tl.dot(qp[j], tl.trans(kp[j]), out)
    return out


@triton.jit
def _split_accumulate(acc, alpha, p, a, s, FMT: tl.constexpr, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr,
                      C3: tl.constexpr, ASM: tl.constexpr):
    """acc (a tuple of [BLOCK_M, W] fp32, one per part) * alpha + p [BLOCK_M, BLOCK_N] . V_j (p in fp16)."""
    vp = _split_parts(a, s, FMT, C0, C1, C2, C3, ASM)
    p = p.to(tl.float16)
    out = ()
    for j in tl.static_range(len(vp)):
        out = out + (tl.dot(p, vp[j], acc[j] * alpha[:, None]),)
    return out


@triton.jit
def _load_k(scale_ptr, code_ptr, keys, kvh, num_kv_heads, ok, FMT: tl.constexpr, D: tl.constexpr, DEQ: tl.constexpr):
    """The attention kernel's loads of one side's rows `keys` (K's, or V's): (a, b, s) for the dequant path
    (kv_dequant._load_raw), or DEQ_SPLIT's tiles (_split_load; b unused)."""
    if DEQ == DEQ_SPLIT and FMT != 0:
        a, s = _split_load(scale_ptr, code_ptr, keys, kvh, num_kv_heads, ok, FMT, D)
        b = ok
    else:
        a, b, s = _load_raw(scale_ptr, code_ptr, keys, kvh, num_kv_heads, ok, FMT, D, DEQ)
    return a, b, s


@triton.jit
def _out_columns(FMT: tl.constexpr, D: tl.constexpr, DEQ: tl.constexpr, J: tl.constexpr):
    """The head_dim channel of each column of V's accumulator J: DEQ_SPLIT's part J, else kv_dequant._columns."""
    if DEQ == DEQ_SPLIT and FMT != 0:
        col = _split_columns(FMT, D, J)
    else:
        col = _columns(FMT, D, DEQ)
    return col


# ---------------------------------------------------------------- reference


def split_values_reference(name: str, scales: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """[..., D] fp32: each value as the split (and words) kernels compute it, q4_0 (q - 8) x scale and
    tq3_0 +-fp16(centroid) x scale, one fp16 multiply (rounded once); tq3_0 stays rotated."""
    s = scales.half().unsqueeze(-1)  # [..., NB, 1]
    if name == "q4_0":
        b = codes.reshape(*codes.shape[:-1], -1, formats.BLOCK // 2)  # [..., NB, 16]
        q = torch.cat((b & 15, b >> 4), dim=-1).half() - 8.0  # exact
    elif name == "tq3_0":
        mag, neg = formats._unpack3(codes)  # [..., NB, 32]
        c = torch.tensor(formats.TQ3_CENTROIDS, dtype=torch.float16, device=codes.device)[mag.long()]
        q = torch.where(neg.bool(), -c, c)
    else:
        raise ValueError(f"split dequantization is for q4_0 and tq3_0, not {name}")
    return (q * s).float().flatten(-2)


def split_planes_reference(p: Planes) -> Planes:
    """Planes -> dense fp32 Planes (original domain) holding what the split kernel multiplies: q4_0 and
    tq3_0 as split_values_reference, q8_0 (split under split_q8, or "words": the same values) as code x
    scale rounded once to fp16, dense ones unchanged."""
    if p.scales is None:
        return p
    if p.name == "q8_0":
        x = formats.dequantize("q8_0", p.scales, p.codes).half().float()
    else:
        x = split_values_reference(p.name, p.scales, p.codes)
        if p.name == "tq3_0":
            x = formats.unrotate(x)
    return Planes("f32", None, x.contiguous())
