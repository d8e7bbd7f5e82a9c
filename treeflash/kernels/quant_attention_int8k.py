"""Plain-torch references for the attention kernel's int8 q.k path (LaunchConfig.k_int8, q8_0 K only):
the query quantized per 32 values to int8, integer dots with K's codes, both scales applied, in
float64 (exact up to the final cast). The kernel itself is `_partial_kernel` in kernels/quant_attention.py
(`_quantize_query`, `_int8_scores`); its dequantize + SDPA reference is `quant_attention_reference` there."""

from __future__ import annotations

import torch

from treeflash.kernels import kv_formats as formats
from treeflash.kernels.kv_quant import Planes
from treeflash.kernels.quant_attention import dequantize_planes, visibility


def int8_query_reference(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D] -> (codes [T, H, D/32, 32] int8, scales [T, H, D/32] fp32): the query as the k_int8
    kernel quantizes it (per 32 values d = max|x| / 127, code = round half away (x / d), in fp32)."""
    xb = q.float().unflatten(-1, (q.shape[-1] // formats.BLOCK, formats.BLOCK))
    d = xb.abs().amax(-1) / 127.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))
    return formats.round_half_away(xb * inv.unsqueeze(-1)).to(torch.int8), d


def _int8_attention(q: torch.Tensor, k: Planes, v: Planes, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """k_int8 numerics in float64 (exact up to the final cast): scores = scale * sum over blocks of
    (int8 q codes . int8 K codes) * q scale * K scale; softmax; p . dequantized V. mask: [T, S] bool."""
    if k.name != "q8_0":
        raise ValueError(f"int8 q.k needs a q8_0 K cache, got {k.name}")
    n, num_heads, head_dim = q.shape
    length = mask.shape[-1] if mask is not None else k.codes.shape[0]
    kv_heads = k.codes.shape[1]
    nb = head_dim // formats.BLOCK
    qc, qd = int8_query_reference(q)  # [T, H, NB, 32], [T, H, NB]; head h = kv head * G + g
    qc = qc.double().unflatten(1, (kv_heads, num_heads // kv_heads))  # [T, Hkv, G, NB, 32]
    qd = qd.double().unflatten(1, (kv_heads, num_heads // kv_heads))
    kc = k.codes[:length].double().unflatten(-1, (nb, formats.BLOCK))  # [S, Hkv, NB, 32]
    part = torch.einsum("tkgbi,skbi->kgtsb", qc, kc)  # integers: exact
    kd = k.scales[:length].double().permute(1, 2, 0)  # [Hkv, NB, S]
    scores = torch.einsum("kgtsb,tkgb,kbs->kgts", part, qd, kd) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask.to(q.device), float("-inf"))
    p = torch.softmax(scores, dim=-1)  # [Hkv, G, T, S]
    values = dequantize_planes(v, length, torch.float64)  # [S, Hkv, D]
    return torch.einsum("kgts,skd->tkgd", p, values).flatten(1, 2).to(q.dtype)


def quant_attention_int8k_reference(
    q: torch.Tensor, k: Planes, v: Planes, start: int, tree_mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Plain torch, `quant_attention`'s contract with k_int8's numerics (q8_0 K only): the query
    quantized per block to int8, integer dots with K's codes, both scales. Differs from
    `quant_attention_reference` by the query's quantization alone."""
    n = q.shape[0]
    return _int8_attention(q, k, v, visibility(n, start, tree_mask, q.device), scale)


def quant_attention_masked_int8k_reference(
    q: torch.Tensor, k: Planes, v: Planes, key_mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Plain torch, `quant_attention_masked`'s contract with k_int8's numerics."""
    return _int8_attention(q, k, v, key_mask, scale)
