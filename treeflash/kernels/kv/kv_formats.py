"""KV cache storage formats: the registry of type names, byte accounting, and plain-torch references.

This module sits in the kernels layer because the Triton kernels (kv_quant.py, quant_attention.py)
read and write these layouts and are checked against these references; the KV cache
(treeflash/kv/quantized.py) imports it from here.

A cache row is one token's keys (or values) for one KV head: `head_dim` values. Compressed
formats cut a row into blocks of 32 values (ggml's block size) and keep, per block, one fp16
scale and the block's codes. Byte counts per 32 values:

- q8_0  (34 bytes): x ~ d * q, q int8, d = amax / 127.
- q4_0  (18 bytes): x ~ d * (q - 8), q in 0..15, d = m / -8 where m is the block's value of
  largest magnitude (sign kept, first one on ties). Byte j of the 16 holds q[j] in its low
  nibble and q[j + 16] in its high nibble (ggml's layout).
- tq3_0 (14 bytes, TurboQuant-style): see `quantize_tq3_0`. 3-bit codes (sign + 2-bit magnitude
  index into 4 Lloyd-Max centroids); byte i < 8 holds the magnitude indices of values 4i..4i+3
  at bits 0-1, 2-3, 4-5, 6-7; byte 8 + i (i < 4) holds the sign bits of values 8i..8i+7 at
  bits 0..7 (1 = negative). Both unpack by widening each byte in place (no interleaving).
- bf16 / f16 / f32: dense, no scale.

Storage is structure-of-arrays: a row's fp16 scales live in one tensor ([..., head_dim / 32])
and its block codes in another ([..., code_bytes]). The bytes are ggml's, split so that every
load is aligned; the byte accounting is the same.

Rounding is "half away from zero" written as sign(v) * floor(|v| + 0.5), the same expression
in the Triton kernels (kernels/kv/kv_quant.py), so that both produce identical codes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

BLOCK = 32  # values per block (ggml's QK)
TQ3_GROUP = 128  # values per rotation group along head_dim
# Lloyd-Max centroids of an 8-level quantizer for the coordinates of a rotated unit vector of
# dimension 128 (N(0, 1/128)); the 3-bit code is a sign and an index into these magnitudes.
TQ3_CENTROIDS = (0.021460, 0.065717, 0.117832, 0.190685)
TQ3_BOUNDS = tuple((a + b) / 2 for a, b in zip(TQ3_CENTROIDS, TQ3_CENTROIDS[1:]))  # nearest-centroid cuts


@dataclass(frozen=True)
class CacheFormat:
    name: str
    block_bytes: int  # bytes per BLOCK values (dense: BLOCK * element size)
    dense_dtype: torch.dtype | None = None  # set for the dense formats
    code_dtype: torch.dtype = torch.uint8  # element type of the codes plane (q8_0: int8)

    @property
    def is_dense(self) -> bool:
        return self.dense_dtype is not None

    @property
    def bits_per_value(self) -> float:
        return self.block_bytes * 8 / BLOCK

    def group_size(self, head_dim: int) -> int:
        """Values per tq3_0 rotation group: 128, or the whole row for head_dim 32 or 64."""
        return min(TQ3_GROUP, head_dim)

    def check_head_dim(self, head_dim: int) -> None:
        if self.is_dense:
            return
        if head_dim % BLOCK:
            raise ValueError(f"cache type {self.name} needs head_dim divisible by {BLOCK}, got {head_dim}")
        if self.name == "tq3_0":
            g = self.group_size(head_dim)
            if g & (g - 1) or head_dim % g:
                raise ValueError(f"cache type tq3_0 needs head_dim = 32, 64 or a multiple of 128, got {head_dim}")

    def num_scales(self, head_dim: int) -> int:
        return 0 if self.is_dense else head_dim // BLOCK

    def code_bytes(self, head_dim: int) -> int:
        """Bytes of the codes plane per row (dense: the row itself)."""
        if self.is_dense:
            return head_dim * self.block_bytes // BLOCK
        return head_dim // BLOCK * (self.block_bytes - 2)

    def row_bytes(self, head_dim: int) -> int:
        self.check_head_dim(head_dim)
        return head_dim * self.block_bytes // BLOCK


FORMATS: dict[str, CacheFormat] = {
    "f32": CacheFormat("f32", 4 * BLOCK, dense_dtype=torch.float32),
    "f16": CacheFormat("f16", 2 * BLOCK, dense_dtype=torch.float16),
    "bf16": CacheFormat("bf16", 2 * BLOCK, dense_dtype=torch.bfloat16),
    "q8_0": CacheFormat("q8_0", 2 + BLOCK, code_dtype=torch.int8),
    "q4_0": CacheFormat("q4_0", 2 + BLOCK // 2),
    "tq3_0": CacheFormat("tq3_0", 2 + BLOCK * 3 // 8),
}
AUTO = "auto"  # the runtime dtype of the model
CACHE_TYPES = (AUTO, *FORMATS)
_DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def get_format(name: str, runtime_dtype: torch.dtype | None = None) -> CacheFormat:
    """The format called `name`; "auto" needs the runtime dtype. Unknown names raise ValueError."""
    if name == AUTO and runtime_dtype is not None and runtime_dtype in _DTYPE_NAMES:
        return FORMATS[_DTYPE_NAMES[runtime_dtype]]
    if name not in FORMATS:
        valid = ", ".join(CACHE_TYPES)
        raise ValueError(f"unknown KV cache type {name!r}; valid types: {valid} (auto = the model's dtype)")
    return FORMATS[name]


def bytes_per_token_per_layer(
    cache_type: str,
    num_kv_heads: int,
    head_dim: int,
    cache_type_v: str | None = None,
    runtime_dtype: torch.dtype | None = None,
) -> int:
    """Bytes one token costs in one attention layer: its keys (cache_type) plus its values
    (cache_type_v, default the same type), for all KV heads."""
    fmt_k = get_format(cache_type, runtime_dtype)
    fmt_v = get_format(cache_type if cache_type_v is None else cache_type_v, runtime_dtype)
    return num_kv_heads * (fmt_k.row_bytes(head_dim) + fmt_v.row_bytes(head_dim))


# ---------------------------------------------------------------- references: quantize / dequantize


def quantize(name: str, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """x: [..., D] float -> (scales [..., D/32] fp16 or None when dense, codes [..., code_bytes])."""
    fmt = get_format(name)
    fmt.check_head_dim(x.shape[-1])
    if fmt.is_dense:
        return None, x.to(fmt.dense_dtype)
    return {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0, "tq3_0": quantize_tq3_0}[name](x)


def dequantize(name: str, scales: torch.Tensor | None, codes: torch.Tensor, rotated: bool = False) -> torch.Tensor:
    """The inverse of `quantize` -> [..., D] fp32. `rotated` (tq3_0 only): stay in the rotated domain."""
    fmt = get_format(name)
    if fmt.is_dense:
        return codes.float()
    if name == "tq3_0":
        return dequantize_tq3_0(scales, codes, rotated)
    return {"q8_0": dequantize_q8_0, "q4_0": dequantize_q4_0}[name](scales, codes)


def round_half_away(v: torch.Tensor) -> torch.Tensor:
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


def _blocks(x: torch.Tensor) -> torch.Tensor:
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))


def quantize_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xb = _blocks(x)  # [..., NB, 32]
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    q = round_half_away(xb * _inverse(d)).to(torch.int8)
    return d.squeeze(-1).half(), q.flatten(-2)


def dequantize_q8_0(scales: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    q = _blocks(codes)
    return (q * scales.float().unsqueeze(-1)).flatten(-2)


def quantize_q4_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xb = _blocks(x)
    first_max = xb.abs().argmax(-1, keepdim=True)  # first index of the largest magnitude
    d = xb.gather(-1, first_max) / -8.0
    q = torch.floor(xb * _inverse(d) + 8.5).clamp(0, 15).to(torch.uint8)
    lo, hi = q.unflatten(-1, (2, BLOCK // 2)).unbind(-2)  # values j and j + 16
    return d.squeeze(-1).half(), (lo | (hi << 4)).flatten(-2)


def dequantize_q4_0(scales: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    b = codes.reshape(*codes.shape[:-1], -1, BLOCK // 2)  # [..., NB, 16]
    q = torch.cat((b & 15, b >> 4), dim=-1).float() - 8.0
    return (q * scales.float().unsqueeze(-1)).flatten(-2)


# ---------------------------------------------------------------- tq3_0


def _signs(n: int, seed: int) -> torch.Tensor:
    """n fixed +-1 values from a 64-bit LCG (Knuth's MMIX constants): part of the format."""
    out, s = [], seed
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(1.0 if (s >> 33) & 1 else -1.0)
    return torch.tensor(out)


@lru_cache(maxsize=None)
def _rotation_cpu(group: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < group:  # Sylvester construction of the Walsh-Hadamard matrix
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    h = h / math.sqrt(group)
    s1, s2 = _signs(group, 0x7133_0001), _signs(group, 0x7133_0002)
    return (s2[:, None] * h * s1[None, :]).contiguous()  # R = D2 H D1, orthonormal


@lru_cache(maxsize=None)
def _on_device(group: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # one copy per device: no host-to-device copy per call (CUDA-graph capture forbids it)
    return _rotation_cpu(group).to(device), torch.tensor(TQ3_CENTROIDS, device=device)


def tq3_rotation(group: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """R [group, group] fp32: y = R x rotates one group; x = R^T y."""
    return _on_device(group, torch.device(device))[0]


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x: [..., D] -> R applied to each group of the last axis (fp32). Preserves dot products."""
    g = min(TQ3_GROUP, x.shape[-1])
    r = tq3_rotation(g, x.device)
    return (x.float().unflatten(-1, (-1, g)) @ r.T).flatten(-2)


def unrotate(y: torch.Tensor) -> torch.Tensor:
    g = min(TQ3_GROUP, y.shape[-1])
    r = tq3_rotation(g, y.device)
    return (y.float().unflatten(-1, (-1, g)) @ r).flatten(-2)


def _centroids(device: torch.device) -> torch.Tensor:
    return _on_device(TQ3_GROUP, torch.device(device))[1]


def quantize_tq3_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group of g = min(128, D) values: rotate (R = D2 H D1), divide by the group's L2 norm,
    and code each coordinate as the nearest of the 8 centroids +-TQ3_CENTROIDS (coordinates
    are first scaled by sqrt(g / 128) so that groups of 32 or 64 see the same distribution).

    The stored scale: block b (32 values) of the rotated row xr gets s_b = ||xr_b|| / ||c_b||,
    c_b the block's chosen centroids, so each dequantized block s_b * c_b has exactly the norm
    of xr_b, and therefore each group (and the row) exactly the norm of x: quantization only
    moves directions. This is DESIGN.md's "norm / ||centroids||" taken per 32-value block: the
    same 2 bytes per block, with less error than one scale per group repeated in its 4 blocks.
    """
    g = min(TQ3_GROUP, x.shape[-1])
    xr = rotate(x)  # [..., D] fp32
    groups = xr.unflatten(-1, (-1, g))
    # the group's norm taken before the rotation (R is orthonormal: the same number to rounding), so the write
    # kernel needs only its own block's share of the rotation
    norm = x.float().unflatten(-1, (-1, g)).square().sum(-1, keepdim=True).sqrt()
    y = (groups * _inverse(norm) * math.sqrt(g / TQ3_GROUP)).flatten(-2)
    mag = sum((y.abs() > b).to(torch.uint8) for b in TQ3_BOUNDS)
    neg = (y < 0).to(torch.uint8)
    c = _centroids(x.device)[mag.long()]
    cb, xb = _blocks(c), _blocks(xr)
    scales = (xb.norm(dim=-1) / cb.norm(dim=-1)).half()
    return scales, _pack3(_blocks(mag).to(torch.uint8), _blocks(neg).to(torch.uint8))


def _pack3(mag: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """mag, neg: [..., NB, 32] -> [..., NB * 12] bytes (layout in the module docstring)."""
    shift_m = torch.arange(0, 8, 2, dtype=torch.uint8, device=mag.device)  # [4]
    mags = (mag.unflatten(-1, (8, 4)) << shift_m).sum(-1, dtype=torch.uint8)  # [..., NB, 8]
    shift_s = torch.arange(8, dtype=torch.uint8, device=mag.device)  # [8]
    signs = (neg.unflatten(-1, (4, 8)) << shift_s).sum(-1, dtype=torch.uint8)  # [..., NB, 4]
    return torch.cat((mags, signs), dim=-1).flatten(-2)


def _unpack3(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = codes.reshape(*codes.shape[:-1], -1, 12)  # [..., NB, 12]
    shift_m = torch.arange(0, 8, 2, dtype=torch.uint8, device=codes.device)
    mag = ((b[..., :8, None] >> shift_m) & 3).flatten(-2)  # [..., NB, 32]: value 4i + k
    shift_s = torch.arange(8, dtype=torch.uint8, device=codes.device)
    neg = ((b[..., 8:, None] >> shift_s) & 1).flatten(-2)  # value 8i + k
    return mag, neg


def dequantize_tq3_0(scales: torch.Tensor, codes: torch.Tensor, rotated: bool = False) -> torch.Tensor:
    mag, neg = _unpack3(codes)
    c = _centroids(codes.device)[mag.long()] * (1.0 - 2.0 * neg.float())  # [..., NB, 32]
    y = (c * scales.float().unsqueeze(-1)).flatten(-2)
    return y if rotated else unrotate(y)
