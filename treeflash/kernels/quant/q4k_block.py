"""One Q4_K super-block read as 32-bit words: the field decoders that gemv_q4k and rows_q4k share.

ggml's block_q4_K is 144 bytes = 36 words: word 0 holds fp16 d (low half) and fp16 dmin (high
half), words 1-3 the 12 bytes of 6-bit scales and mins (get_scale_min_k4), words 4-35 the 128 bytes
of 4-bit codes. Code byte l of chunk c (qs[32c + l], c = 0..3) holds value 64c + l in its low nibble
(group 2c) and value 64c + 32 + l in its high nibble (group 2c + 1); the weight of a value of group
g is d * sc_g * q - dmin * m_g (reference.py's _q4_k, in that order of products).
"""

from __future__ import annotations

import triton
import triton.language as tl

WORDS = tl.constexpr(36)  # a Q4_K block: 144 bytes


@triton.jit
def half_low(w):
    """The low 16 bits of each int32 as an fp16, returned as fp32."""
    return (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def nibble(w, shift):
    """int32 words -> the 4-bit code at bit `shift` (broadcast against w) of each, as an exact fp32:
    (q | 0x4B000000) read as fp32 is 2^23 + q, so one subtraction replaces an int-to-float conversion."""
    return (((w >> shift) & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _scale_byte(w1, w2, w3, i: tl.constexpr):
    """Byte i (0..11) of the block's 12 scale bytes, held in words w1..w3 ([R] int32)."""
    if i < 4:
        w = w1
    elif i < 8:
        w = w2
    else:
        w = w3
    return (w >> (8 * (i % 4))) & 255


@triton.jit
def scale_min_int(w1, w2, w3, g: tl.constexpr):
    """Group g's 6-bit scale and min (ggml's get_scale_min_k4) as int32 [R]."""
    if g < 4:
        sc = _scale_byte(w1, w2, w3, g) & 63
        mn = _scale_byte(w1, w2, w3, g + 4) & 63
    else:
        sc = (_scale_byte(w1, w2, w3, g + 4) & 15) | ((_scale_byte(w1, w2, w3, g - 4) >> 6) << 4)
        mn = (_scale_byte(w1, w2, w3, g + 4) >> 4) | ((_scale_byte(w1, w2, w3, g) >> 6) << 4)
    return sc, mn


@triton.jit
def scale_min(w1, w2, w3, g: tl.constexpr):
    """Group g's 6-bit scale and min (ggml's get_scale_min_k4) as fp32 [R]."""
    sc, mn = scale_min_int(w1, w2, w3, g)
    return sc.to(tl.float32), mn.to(tl.float32)
