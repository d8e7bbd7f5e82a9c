"""Rotary frequencies, with the context-extension scalings transformers implements for our targets.

A checkpoint that was trained short and extended (YaRN on Qwen2.5/Qwen3/Qwen3.5 long-context
releases, llama3 on Llama 3.x, linear position interpolation) must rotate with the frequencies it
was extended with, or attention past the original context degrades silently. So the scaling is
parsed once, here, into `RopeScaling` items on ModelConfig; a type we do not implement is a
ModelLoadError naming it, never ignored.

Types and their math (transformers' modeling_rope_utils is the oracle):
- default: inv_freq[i] = base ** (-2i / dim).
- linear: inv_freq / factor (positions interpolated by `factor`).
- llama3: wavelengths longer than original_ctx / low_freq_factor divided by factor, shorter than
  original_ctx / high_freq_factor kept, a smooth blend between.
- yarn (arXiv 2309.00071): per dimension, a linear ramp between interpolation (inv_freq / factor)
  and extrapolation (inv_freq), with the ramp's ends at the dimensions that turn beta_fast and
  beta_slow times over original_ctx; cos and sin are multiplied by attention_factor
  (default 0.1 * ln(factor) + 1, or mscale / mscale_all_dim when both are given).
- dynamic (NTK) is refused: its frequencies change with the length of each forward, so a verify
  batch (drafted nodes included) would rotate differently from plain decoding: not lossless.

Qwen3.5's `mrope_section` (interleaved multimodal rope) needs no code for text: all three position
axes carry the same text position, so every section rotates by that position, which is plain rope.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from treeflash.errors import ModelLoadError

SUPPORTED = ("default", "linear", "llama3", "yarn")
KEYS = {  # the rope_parameters entries each type reads (the rest are ignored by transformers too)
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
}
WHY_NOT = {
    "dynamic": "dynamic NTK changes the frequencies with each forward's length, so speculative verification would not be lossless",
    "longrope": "longrope is not implemented",
}


def parse_scaling(rope: dict[str, Any], max_position_embeddings: int, source: str) -> tuple[tuple[str, Any], ...]:
    """rope_parameters / rope_scaling dict -> sorted (key, value) items for ModelConfig.rope_scaling
    (empty for default rope). Raises ModelLoadError for a type treeflash does not implement."""
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    if rope_type == "default":
        return ()
    if rope_type not in SUPPORTED:
        why = WHY_NOT.get(rope_type, "unknown type")
        raise ModelLoadError(f"{source}: rope scaling {rope_type!r} is not supported ({why}); supported: {', '.join(SUPPORTED)}")
    items = {k: rope[k] for k in KEYS[rope_type] if rope.get(k) is not None}
    if rope_type in ("llama3", "yarn"):  # transformers' standardize_rope_params default
        items.setdefault("original_max_position_embeddings", max_position_embeddings)
    if not isinstance(items.get("factor"), (int, float)) or items["factor"] <= 0:
        raise ModelLoadError(f"{source}: rope scaling {rope_type!r} needs a positive numeric factor, got {rope.get('factor')!r}")
    return tuple(sorted({"rope_type": rope_type, **items}.items()))


def inv_freq_and_scale(base: float, dim: int, scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """-> (inv_freq [dim // 2] fp64, attention_factor): cos and sin are multiplied by the latter."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / scaling["factor"], 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if rope_type == "yarn":
        return _yarn(inv_freq, base, dim, scaling)
    raise ModelLoadError(f"rope scaling {rope_type!r} is not supported")


def _llama3(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = s["factor"]
    low, high = s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_ctx = s.get("original_max_position_embeddings", 8192)
    low_wl, high_wl = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= high_wl) & (wavelen <= low_wl)
    return torch.where(is_mid, mid, scaled)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(inv_freq: torch.Tensor, base: float, dim: int, s: dict[str, Any]) -> tuple[torch.Tensor, float]:
    factor, old_ctx = float(s["factor"]), s["original_max_position_embeddings"]
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention_factor = _mscale(factor, m) / _mscale(factor, m_all) if m and m_all else _mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:  # the dimension that turns `rotations` times over old_ctx
        return dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep the trained frequency (fast dims), 0: interpolate by factor
    return inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate, float(attention_factor)


def rope_parameters_from_gguf(meta: dict[str, Any], arch: str, source: str) -> dict[str, Any]:
    """`{arch}.rope.scaling.*` -> Hugging Face rope_parameters (empty: unscaled). llama.cpp's yarn
    multiplies its own mscale (0.1 ln(factor) + 1) by `attn_factor`; HF's attention_factor is the
    product. A type or option we cannot reproduce exactly is refused, naming the key."""
    key = lambda k: f"{arch}.rope.scaling.{k}"  # noqa: E731
    kind = meta.get(key("type"), "none")
    factor = float(meta.get(key("factor"), 1.0))
    if kind in ("none", None) or factor in (0.0, 1.0):  # llama.cpp reads factor 0 as "unset"
        return {}
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind != "yarn":
        raise ModelLoadError(f"{source}: rope scaling {kind!r} ({key('type')}) is not supported; supported: linear, yarn")
    for k, neutral in (("yarn_log_multiplier", 0.0), ("yarn_ext_factor", None)):
        v = meta.get(key(k))
        if v is not None and float(v) not in ((0.0,) if neutral == 0.0 else (-1.0, 1.0)):
            raise ModelLoadError(f"{source}: {key(k)} = {v} is not supported (only plain YaRN is)")
    out: dict[str, Any] = {"rope_type": "yarn", "factor": factor}
    if key("original_context_length") in meta:
        out["original_max_position_embeddings"] = int(meta[key("original_context_length")])
    for ours, theirs in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
        if key(theirs) in meta:
            out[ours] = float(meta[key(theirs)])
    attn = meta.get(key("attn_factor"), meta.get(key("yarn_attn_factor")))
    if attn is not None and float(attn) != 1.0:
        out["attention_factor"] = float(attn) * (0.1 * math.log(factor) + 1.0)
    return out
