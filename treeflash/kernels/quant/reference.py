"""Plain-torch dequantizers of the GGUF block formats: the contract every quant kernel is checked against.

Each equals `gguf.quants.dequantize` bit for bit (tests/kernels/quant/test_reference.py): the same
fp16 -> fp32 scale conversions and the same fp32 products in the same order (d * sc first, then
times q, then the min), since IEEE products are exact functions of their operands. The byte layouts
are ggml's (ggml-common.h block_q4_K etc.); element e of a 256-value block is written below as
e = c * 128 + s * 32 + j where the layout packs sub-blocks that way.
"""

from __future__ import annotations

import torch

from treeflash.kernels.quant.formats import check_blocks, get_format

# IQ4_NL / IQ4_XS: the 16 non-uniform levels a 4-bit code stands for (ggml's kvalues_iq4nl)
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[nb, 2] uint8 (a little-endian fp16) -> [nb, 1] fp32."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[nb, n] bytes -> [nb, 2n] int: the low nibbles of all bytes, then the high nibbles."""
    q = qs.to(torch.int32)
    return torch.cat([q & 15, q >> 4], dim=-1)


def _bits(b: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """[nb, ..., n] bytes -> [nb, ..., len(shifts), n] int: (b >> s) & mask for each shift s."""
    q = b.to(torch.int32).unsqueeze(-2)
    return (q >> torch.tensor(shifts, dtype=torch.int32, device=b.device).view(-1, 1)) & mask


def _q4_0(b):
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:]) - 8).float()


def _q4_1(b):
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).float() + _f16(b[:, 2:4])


def _high_bits32(qh: torch.Tensor) -> torch.Tensor:
    """[nb, 4] bytes (a little-endian uint32) -> [nb, 32] int: bit e for element e."""
    return _bits(qh, list(range(8)), 1).transpose(-1, -2).reshape(qh.shape[0], 32)


def _q5_0(b):
    q = _nibbles(b[:, 6:]) | (_high_bits32(b[:, 2:6]) << 4)
    return _f16(b[:, :2]) * (q - 16).float()


def _q5_1(b):
    q = _nibbles(b[:, 8:]) | (_high_bits32(b[:, 4:8]) << 4)
    return _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])


def _q8_0(b):
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _q2_k(b):
    nb = b.shape[0]
    sc = b[:, :16].to(torch.int32)
    dl = (_f16(b[:, 80:82]) * (sc & 15).float()).view(nb, 16, 1)
    ml = (_f16(b[:, 82:84]) * (sc >> 4).float()).view(nb, 16, 1)
    q = _bits(b[:, 16:80].reshape(nb, 2, 32), [0, 2, 4, 6], 3).reshape(nb, 16, 16).float()  # e = c*128 + s*32 + j
    return (dl * q - ml).reshape(nb, 256)


def _q3_k(b):
    nb = b.shape[0]
    s = b[:, 96:108].to(torch.int32)
    low = torch.cat([s[:, :8] & 15, s[:, :8] >> 4], dim=-1)  # scale g: low 4 bits
    high = _bits(b[:, 104:108], [0, 2, 4, 6], 3).reshape(nb, 16)  # scale g: bits 4-5
    scales = ((low | (high << 4)) - 32).float()
    dl = (_f16(b[:, 108:110]) * scales).view(nb, 16, 1)
    ql = _bits(b[:, 32:96].reshape(nb, 2, 32), [0, 2, 4, 6], 3).reshape(nb, 16, 16)
    hm = _bits(b[:, :32], list(range(8)), 1).reshape(nb, 16, 16)  # bit e // 32 of hmask byte e % 32
    q = (ql - ((hm ^ 1) << 2)).float()  # the high bit set means no -4 offset
    return (dl * q).reshape(nb, 256)


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins ([nb, 8] int each)."""
    s = s.to(torch.int32)
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=-1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=-1)
    return sc, mn


def _q4_k(b):
    nb = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).view(nb, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).view(nb, 8, 1)
    q = _bits(b[:, 16:].reshape(nb, 4, 32), [0, 4], 15).reshape(nb, 8, 32).float()  # e = c*64 + s*32 + j
    return (d * q - dm).reshape(nb, 256)


def _q5_k(b):
    nb = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).view(nb, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).view(nb, 8, 1)
    ql = _bits(b[:, 48:].reshape(nb, 4, 32), [0, 4], 15).reshape(nb, 8, 32)
    qh = _bits(b[:, 16:48], list(range(8)), 1).reshape(nb, 8, 32)  # bit g of qh byte j
    return (d * (ql | (qh << 4)).float() - dm).reshape(nb, 256)


def _q6_k(b):
    nb = b.shape[0]
    d = (_f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()).view(nb, 16, 1)
    ql = _bits(b[:, :128].reshape(nb, 2, 64), [0, 4], 15).reshape(nb, 2, 4, 32)  # [c, s, j]: ql byte c*64 + (s%2)*32 + j
    qh = _bits(b[:, 128:192].reshape(nb, 2, 32), [0, 2, 4, 6], 3)  # [c, s, j]
    q = ((ql | (qh << 4)) - 32).reshape(nb, 16, 16).float()
    return (d * q).reshape(nb, 256)


def _levels(device) -> torch.Tensor:
    """IQ4_LEVELS as fp32 on device (a lookup table for the 4-bit codes)."""
    return torch.tensor(IQ4_LEVELS, dtype=torch.float32, device=device)


def _iq4_nl(b):
    return _f16(b[:, :2]) * _levels(b.device)[_nibbles(b[:, 2:]).long()]


def _iq4_xs(b):
    nb = b.shape[0]
    sl = _bits(b[:, 4:8], [0, 4], 15).transpose(-1, -2).reshape(nb, 8)  # scale g: nibble g % 2 of byte g // 2
    sh = b[:, 2:4].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    sh = (sh >> torch.arange(0, 16, 2, dtype=torch.int32, device=b.device)) & 3
    dl = (_f16(b[:, :2]) * ((sl | (sh << 4)) - 32).float()).view(nb, 8, 1)
    q = _bits(b[:, 8:].reshape(nb, 8, 16), [0, 4], 15).reshape(nb, 8, 32)  # e = g*32 + s*16 + j
    return (dl * _levels(b.device)[q.long()]).reshape(nb, 256)


_DEQUANT = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q2_K": _q2_k,
            "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs}


def dequantize_ref(blocks: torch.Tensor, fmt: str, k: int) -> torch.Tensor:
    """blocks uint8 [N, K // block_values * block_bytes] (rows as stored in GGUF) -> fp32 [N, K];
    plain torch, on any device, bit-identical to gguf.quants.dequantize."""
    f = get_format(fmt)
    n = check_blocks(blocks, f, k)
    flat = blocks.reshape(n * (k // f.block_values), f.block_bytes)  # one block per row
    return _DEQUANT[f.name](flat).reshape(n, k)
