"""Dequantization of GGUF tensor data (ggml block layouts), vectorized in torch.

Runs on whatever device the raw bytes are on, so a GPU load dequantizes on the GPU. Each
quantized type stores blocks of `block_elems` values in `block_bytes` bytes; `d` is a per-block
fp16 scale, `m`/`dmin` an fp16 offset. Layouts (as ggml defines them, little-endian):

    Q8_0  [d][qs: 32 x int8]                                       x = d * q
    Q4_0  [d][qs: 16 bytes, low nibbles = x[0:16], high = x[16:32]] x = d * (q - 8)
    Q4_1  [d][m][qs: as Q4_0]                                      x = d * q + m
    Q5_0  [d][qh: 32 bits, bit j = 5th bit of x[j]][qs: as Q4_0]   x = d * (q - 16)
    Q5_1  [d][m][qh][qs]                                           x = d * q + m
    Q4_K  super-block of 256 = 8 sub-blocks of 32, 6-bit scale and min per sub-block packed in
          12 bytes; [d][dmin][scales: 12][qs: 128], qs chunk j (32 bytes) holds sub-block 2j in
          its low nibbles and 2j+1 in its high nibbles.             x = d * sc * q - dmin * mn
    Q5_K  [d][dmin][scales: 12][qh: 32][qs: 128]; bit s of qh[l] is the 5th bit of element l of
          sub-block s.
    Q6_K  [ql: 128][qh: 64][scales: 16 x int8][d]; 16 sub-blocks of 16 (x = d * sc * (q - 32)),
          each half of 128 values takes 64 bytes of ql (low nibbles then high nibbles) and 32 of
          qh (2 bits per value, four 32-value rows per byte).
"""

from __future__ import annotations

import math

import torch
from gguf import GGMLQuantizationType as T

MAX_CHUNK_ELEMS = 1 << 24  # values dequantized at once

# type -> (values per block, bytes per block)
BLOCK_LAYOUT: dict[int, tuple[int, int]] = {
    T.F32: (1, 4),
    T.F16: (1, 2),
    T.BF16: (1, 2),
    T.Q8_0: (32, 34),
    T.Q4_0: (32, 18),
    T.Q4_1: (32, 20),
    T.Q5_0: (32, 22),
    T.Q5_1: (32, 24),
    T.Q4_K: (256, 144),
    T.Q5_K: (256, 176),
    T.Q6_K: (256, 210),
}


def type_name(ggml_type: int) -> str:
    try:
        return T(ggml_type).name
    except ValueError:
        return f"ggml type {ggml_type}"


def nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes that a tensor of `shape` (torch order) takes when stored as `ggml_type`."""
    elems, size = BLOCK_LAYOUT[ggml_type]
    n = math.prod(shape)
    if shape and shape[-1] % elems:
        raise ValueError(f"row length {shape[-1]} is not a multiple of the {type_name(ggml_type)} block size {elems}")
    return n // elems * size


def dequantize(
    raw: torch.Tensor,  # [nbytes] uint8, on any device
    ggml_type: int,
    shape: tuple[int, ...],  # torch order (outermost first)
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # shape, dtype, on raw's device
    if ggml_type not in BLOCK_LAYOUT:
        raise ValueError(f"unsupported tensor type {type_name(ggml_type)}; supported: {', '.join(type_name(t) for t in BLOCK_LAYOUT)}")
    want = nbytes(ggml_type, shape)
    if raw.dtype != torch.uint8 or raw.numel() != want:
        raise ValueError(f"{type_name(ggml_type)} {tuple(shape)} needs {want} bytes, got {raw.numel()}")
    raw = raw.reshape(-1)
    if ggml_type == T.F32:
        return raw.view(torch.float32).reshape(shape).to(dtype)
    if ggml_type == T.F16:
        return raw.view(torch.float16).reshape(shape).to(dtype)
    if ggml_type == T.BF16:
        return raw.view(torch.bfloat16).reshape(shape).to(dtype)
    elems, size = BLOCK_LAYOUT[ggml_type]
    blocks = raw.view(-1, size)  # [n_blocks, block_bytes]
    step = max(1, MAX_CHUNK_ELEMS // elems)  # bounds the fp32 temporaries of a huge tensor
    if blocks.shape[0] <= step:
        return _DEQUANT[ggml_type](blocks).reshape(shape).to(dtype)
    out = torch.empty(blocks.shape[0], elems, dtype=dtype, device=raw.device)
    for i in range(0, blocks.shape[0], step):
        out[i : i + step] = _DEQUANT[ggml_type](blocks[i : i + step])
    return out.reshape(shape)


# -- per-type block decoders: [n, block_bytes] uint8 -> [n, block_elems] fp32 --


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 -> [n, 1] fp32 (one little-endian fp16 per row)."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., k] uint8 -> [..., 2k]: all low nibbles, then all high nibbles."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1)


def _bits(b: torch.Tensor) -> torch.Tensor:
    """[..., k] uint8 -> [..., 8k] uint8: bit i of byte j at 8j + i (a little-endian bit field)."""
    shifts = torch.arange(8, device=b.device, dtype=torch.uint8)
    return ((b[..., None] >> shifts) & 1).flatten(-2)


def _q8_0(b):
    return _f16(b[:, :2]) * b[:, 2:].contiguous().view(torch.int8).float()


def _q4_0(b):
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:]).float() - 8.0)


def _q4_1(b):
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).float() + _f16(b[:, 2:4])


def _q5_0(b):
    q = _nibbles(b[:, 6:]) | (_bits(b[:, 2:6]) << 4)
    return _f16(b[:, :2]) * (q.float() - 16.0)


def _q5_1(b):
    q = _nibbles(b[:, 8:]) | (_bits(b[:, 4:8]) << 4)
    return _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, 12] packed 6-bit scales and mins -> ([n, 8], [n, 8]) fp32.

    Sub-blocks 0-3 keep their 6 bits in the low bits of bytes 0-3 (scale) and 4-7 (min); sub-blocks
    4-7 keep their low 4 bits in the nibbles of bytes 8-11 and their top 2 bits in the top bits
    of bytes 0-3 (scale) and 4-7 (min).
    """
    sc = torch.cat((s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)), dim=1)
    mn = torch.cat((s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)), dim=1)
    return sc.float(), mn.float()


def _k_quads(qs: torch.Tensor) -> torch.Tensor:
    """[n, 128] -> [n, 8, 32] uint8: chunk j's low nibbles are sub-block 2j, its high nibbles 2j+1."""
    chunks = qs.reshape(-1, 4, 1, 32)
    return torch.cat((chunks & 0x0F, chunks >> 4), dim=2).reshape(-1, 8, 32)


def _q4_k(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    q = _k_quads(b[:, 16:144]).float()
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1, 256)


def _q5_k(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    shifts = torch.arange(8, device=b.device, dtype=torch.uint8)
    high = (b[:, None, 16:48] >> shifts[None, :, None]) & 1  # [n, 8, 32]: bit s of qh[l]
    q = (_k_quads(b[:, 48:176]) | (high << 4)).float()
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1, 256)


def _q6_k(b):
    ql = b[:, 0:128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)
    low = _nibbles(ql)  # [n, 2, 128]
    shifts = torch.arange(0, 8, 2, device=b.device, dtype=torch.uint8)[None, None, :, None]
    high = ((qh >> shifts) & 3).reshape(-1, 2, 128)  # value 32k + l of a half: bits 2k of qh[l]
    q = ((low | (high << 4)).float() - 32.0).reshape(-1, 16, 16)
    sc = b[:, 192:208].contiguous().view(torch.int8).float()  # [n, 16]: one per 16 values
    d = _f16(b[:, 208:210])
    return ((d * sc)[:, :, None] * q).reshape(-1, 256)


_DEQUANT = {
    T.Q8_0: _q8_0,
    T.Q4_0: _q4_0,
    T.Q4_1: _q4_1,
    T.Q5_0: _q5_0,
    T.Q5_1: _q5_1,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
}
