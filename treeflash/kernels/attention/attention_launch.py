"""Launch configuration of the split-K attention kernels (kernels/attention/quant_attention.py): block sizes,
warps, dequantization scheme per K/V type, the named variants the GPU sweeps compare, and how the
key axis is cut into splits. Fixed configurations, no autotuning (the Triton interpreter on the
CPU needs them, and the choices are measured: docs/kv.md).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton

from treeflash.kernels.kv.kv_dequant import DEQ_IDS

FMT_IDS = {"q8_0": 1, "q4_0": 2, "tq3_0": 3}  # the kernels' FMT_K / FMT_V; anything dense is 0
MAX_SPLITS = 256  # the combine kernel holds [splits, 64] (over 128 splits: [splits, 32]) partial outputs in registers
PROGRAMS_PER_SM = 2
BLOCK_M_MAX = 32  # query rows per program over 16 rows (launch_config); 64 / 128-row tiles lost (docs/journal.md, stop 22)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int  # query rows (token x GQA head) per program
    block_n: int  # keys per inner step
    num_warps: int
    num_stages: int
    programs_per_sm: int  # split-K target: splits ~ programs_per_sm * SMs / (m_tiles * kv_heads)
    prefetch: bool = True  # load block i + 1's bytes before block i's math (hides memory latency)
    dequant: str = "blocks_fast"  # a key of DEQ_IDS: how compressed blocks become [BLOCK_N, D] floats
    # V's own scheme (None: `dequant`). "half" / "words" (q8_0, q4_0) dequantize to fp16 and run both
    # dots in fp16 when the query is 16-bit and neither side is dense; an fp32 query takes "flat" instead
    dequant_v: str | None = None
    # "split" on a q8_0 side too (the split8_* variants): four [N, D/4] fp16 parts from its int32 words
    # (kernels/attention/kv_split.py) instead of "words". Off: a q8_0 side under "split" runs "words"
    split_q8: bool = False

    def __post_init__(self):
        for name in ("dequant", "dequant_v"):
            value = getattr(self, name)
            if value is not None and value not in DEQ_IDS or name == "dequant" and value is None:
                raise ValueError(f"LaunchConfig: {name} must be one of {sorted(DEQ_IDS)}, got {value!r}")
        if self.split_q8 and "split" not in (self.dequant, self.dequant_v):
            raise ValueError("LaunchConfig: split_q8 needs dequant or dequant_v 'split'")
        for name in ("block_m", "block_n"):
            n = getattr(self, name)
            if n < 16 or n & (n - 1):
                raise ValueError(f"LaunchConfig: {name} must be a power of two >= 16 (tl.dot), got {n}")


# Launch variants that bench/kv_attention_gpu.py --sweep times against each other on the GPU
# (compressed K or V; the dense path keeps launch_config's own choice). Names are stable.
VARIANTS: dict[str, dict] = {
    "fast_n32_w4_pf": dict(dequant="blocks_fast", block_n=32, num_warps=4, prefetch=True),  # the default
    "fast_n64_w4": dict(dequant="blocks_fast", block_n=64, num_warps=4, prefetch=False),
    "flat_n32_w4": dict(dequant="flat", block_n=32, num_warps=4, prefetch=False),  # q8_0/q8_0's default
    # more programs per SM (splits ~ programs_per_sm * SMs / programs per split): no faster so far
    "flat_n32_w4_p4": dict(dequant="flat", block_n=32, num_warps=4, prefetch=False, programs_per_sm=4),
    "fast_n32_w4_pf_p4": dict(dequant="blocks_fast", block_n=32, num_warps=4, prefetch=True, programs_per_sm=4),
    # fp16 dequantization (q8_0 / q4_0; a tq3_0 side keeps its fp32 path): "words" loads 32-bit words
    # and unpacks them with byte permutes (inline PTX on the GPU), which keeps V's tile off byte-wise
    # shared-memory loads; "half" loads bytes. Offline sm_90a compile, q8_0/q8_0, 16 rows, head_dim 256:
    # 769 SASS instructions per 32-key step and 135 registers (words, 4 warps) against flat's 1325 / 251
    "words_n32_w4": dict(dequant="words", block_n=32, num_warps=4, prefetch=False),
    "words_n32_w8": dict(dequant="words", block_n=32, num_warps=8, prefetch=False),
    "words_n64_w8": dict(dequant="words", block_n=64, num_warps=8, prefetch=False),
    "words_n32_w4_p4": dict(dequant="words", block_n=32, num_warps=4, prefetch=False, programs_per_sm=4),
    "halfk_wordsv_n32_w4": dict(dequant="half", dequant_v="words", block_n=32, num_warps=4, prefetch=False),
    # "split" (q4_0 / tq3_0 sides where split_fits; a q8_0 side runs "words", unlike split8_*): "words"
    # numerics, no joins: fp16 parts (q4_0 four [N, D/4], tq3_0 eight [N, D/8]) dequantized in the dot
    # operand's layout, each dotted with the query's (or the output's) matching channels
    # (kernels/attention/kv_split.py; timed on the H200 since: docs/kv.md). Offline sm_90a counts (bench/kv_split_sass.py,
    # head_dim 256, 4 warps, 32 keys): tq3_0/tq3_0 1,065 SASS instructions a step against words' 1,408,
    # q4_0/q4_0 707 against 941
    "split_n32_w4": dict(dequant="split", block_n=32, num_warps=4, prefetch=False),
    "split_n64_w4": dict(dequant="split", block_n=64, num_warps=4, prefetch=False),
    "split_n32_w8": dict(dequant="split", block_n=32, num_warps=8, prefetch=False),
    # "split" with q8_0 sides split too (split_q8; launch_config's decode default for q8_0 K with a q8_0 or
    # tq3_0 V since bench/results/s21/kv_sweep_split*.json timed it on the H200): four [N, D/4] fp16 parts
    # from words' int32 loads and PTX, so V skips its shared-memory round trip. Offline sm_90a counts
    # (bench/kv_split_sass.py, head_dim 256, 4 warps, 32 keys; docs/kv.md, the last section): q8_0/q8_0 798
    # SASS instructions a step against words' 855, q8_0/q4_0 730 against split's 840. split8_n64_w4 spills
    # at head_dim 256 with a q8_0 K (12-64 bytes): it is for head_dim 128
    "split8_n32_w4": dict(dequant="split", split_q8=True, block_n=32, num_warps=4, prefetch=False),
    "split8_n64_w4": dict(dequant="split", split_q8=True, block_n=64, num_warps=4, prefetch=False),
    "split8_n32_w8": dict(dequant="split", split_q8=True, block_n=32, num_warps=8, prefetch=False),
}


def variant_config(name: str, head_dim: int, rows: int) -> LaunchConfig:
    """launch_config for a compressed cache with VARIANTS[name]'s fields replaced."""
    if name not in VARIANTS:
        raise ValueError(f"unknown launch variant {name!r}; known: {', '.join(VARIANTS)}")
    return dataclasses.replace(launch_config(head_dim, rows), **VARIANTS[name])


def launch_config(head_dim: int, rows: int, dense_kv: bool = False, compressed_kv: bool = False, tq3_side: bool = False,
                  formats: tuple[str, str] | None = None) -> LaunchConfig:
    """The fixed launch configuration for a head_dim and T * G query rows (no autotuning).

    Measured on an H200 (decode at 32K context, 24 query / 4 KV heads, head_dim 256), with the
    "blocks" dequantization: with compressed K/V, 4 warps, 32 keys a step and the register
    prefetch took q8_0/q8_0 from 114 us (8 warps, no prefetch) to 69 us and tq3_0/tq3_0 from 220
    to 138 us; with dense K and V (`dense_kv`), Triton's own pipelining of loads that feed tl.dot
    does better without it (46 us against 67 us). head_dim <= 128 uses 64 keys a step (not
    measured separately). "blocks_fast" is the default on a static count, not yet a measurement:
    sm_90 SASS of the tq3_0/tq3_0 loop has 22% fewer instructions (no select chain), q8_0 trades
    its quarter-rate I2F conversions for full-rate integer ops, q4_0 compiles the same; VARIANTS
    and `bench/kv_attention_gpu.py --sweep` are how to choose on the GPU.

    Measured since (two H200 sweeps, bench/results/kv_attention_sweep*.json): blocks_fast is a little
    faster than blocks for tq3_0 (0.06-0.07 of the roofline against 0.05-0.06), the same for q4_0
    and q8_0; q8_0/q8_0 at head_dim 256 was fastest with "flat" (2-D per-column loads, no reshapes),
    0.36 of the roofline at 32K and 0.44 at 128K against 0.23 / 0.26 (flat remains the fp32 path).

    `compressed_kv` (K and V both compressed) takes "words" (fp16 dequantization from 32-bit words, both
    dots in fp16; an fp32 query falls back to the fp32 path in quant_attention._schemes). H200 sweeps
    (bench/results/s18/kv_attention_sweep4.json and sweep6.json, head_dim 256), decode at 32K / 128K,
    fraction of the roofline: q8_0/q8_0 0.40 / 0.50 against flat's 0.33 / 0.41, q8_0/q4_0 0.28 / 0.34
    against 0.19 / 0.21, q4_0/q4_0 0.18 / 0.22 against 0.12 / 0.13, q4_0/q8_0 0.25 / 0.30, q8_0/tq3_0
    0.18 / 0.23 against 0.12 / 0.14, tq3_0/tq3_0 0.07 / 0.08 against 0.06 / 0.07. 8 warps or 64 keys a
    step were slower;
    at head_dim 128 (bench/results/s18/kv_attention_sweep_hd128.json) 64 keys a step (this default)
    gave q8_0/q8_0 0.34 / 0.40 against flat's 0.23 / 0.26. More programs per SM with capped registers
    (ptx .maxnreg 168 or 128, 2 stages) were no faster (kv_attention_sweep5.json): ncu shows 2
    programs per SM, 4 cycles between issues per warp and the L1/shared-memory pipe 77% busy."""
    block_m = 16 if rows <= 16 else min(BLOCK_M_MAX, _next_pow2(rows))
    block_n = 64 if head_dim <= 128 else 32
    if dense_kv:
        return LaunchConfig(block_m, block_n, 4 if head_dim <= 128 else 8, 3, PROGRAMS_PER_SM, prefetch=False)
    if compressed_kv:
        # "split" where the H200 measured it faster (bench/results/s20/kv_sweep_split.json, head_dim 256):
        # decode (one m-tile) of every pair with a q4_0 / tq3_0 side, and verify without a tq3_0 side
        # (16-node verify: q4_0/q4_0 163 against 245 us, but tq3_0/tq3_0 505 against 362); a q8_0 side
        # runs "words" inside it either way. Other head_dims were not timed: "words"
        split = head_dim >= 256 and (rows <= 16 or not tq3_side)
        # q8_0 K split too (split8_*) in decode where bench/results/s21/kv_sweep_split*.json measured it
        # faster, 32K / 128K fraction of the roofline: head_dim 256 q8_0/q8_0 0.41 / 0.52 against words'
        # 0.41 / 0.50 and q8_0/tq3_0 0.24 / 0.36 against split's 0.23 / 0.33 (q8_0/q4_0 lost: 0.33 / 0.43
        # against 0.34 / 0.45); head_dim 128 q8_0/q8_0 with 64 keys a step 0.34 / 0.42 against 0.34 / 0.40
        if formats is not None and rows <= 16 and formats[0] == "q8_0":
            if head_dim >= 256 and formats[1] in ("q8_0", "tq3_0"):
                return LaunchConfig(block_m, 32, 4, 3, PROGRAMS_PER_SM, prefetch=False, dequant="split", split_q8=True)
            if head_dim == 128 and formats[1] == "q8_0":
                return LaunchConfig(block_m, 64, 4, 3, PROGRAMS_PER_SM, prefetch=False, dequant="split", split_q8=True)
        # q4_0/q4_0 and tq3_0/tq3_0 decode at head_dim 256 take 64 keys a step (split_n64_w4): fraction of the
        # roofline against split_n32_w4 at 32K / 64K / 128K, q4_0 0.25 / 0.30 / 0.34 against 0.25 / 0.28 / 0.32,
        # tq3_0 0.10 / 0.14 / 0.17 against 0.09 / 0.11 / 0.13 (H200: bench/results/s21/kv_sweep_split.json,
        # s27/kv_sweep_64k.json). Mixed pairs were not timed with it; q8_0 beside q4_0 / tq3_0 lost at 32K
        if formats is not None and rows <= 16 and head_dim >= 256 and formats[0] == formats[1] in ("q4_0", "tq3_0"):
            return LaunchConfig(block_m, 64, 4, 3, PROGRAMS_PER_SM, prefetch=False, dequant="split")
        return LaunchConfig(block_m, block_n, 4, 3, PROGRAMS_PER_SM, prefetch=False, dequant="split" if split else "words")
    return LaunchConfig(block_m, block_n, 4, 3, PROGRAMS_PER_SM, prefetch=True, dequant="blocks_fast")


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def split_count(num_blocks: int, programs_per_split: int, device: torch.device, programs_per_sm: int = PROGRAMS_PER_SM) -> int:
    """How many splits put about programs_per_sm programs on every SM (at most one per key block)."""
    want = triton.cdiv(programs_per_sm * _sm_count(device), programs_per_split)
    return max(1, min(num_blocks, want, MAX_SPLITS))


def plan_splits(
    num_blocks: int, programs_per_split: int, device: torch.device, programs_per_sm: int = PROGRAMS_PER_SM
) -> tuple[int, int]:
    """(num_splits, blocks_per_split): about programs_per_sm programs per SM; blocks_per_split is a
    power of two (a compile-time loop bound), so a growing context recompiles only when it doubles."""
    want = split_count(num_blocks, programs_per_split, device, programs_per_sm)
    per_split = _next_pow2(triton.cdiv(num_blocks, want))
    return triton.cdiv(num_blocks, per_split), per_split


HALF_SCHEMES = (DEQ_IDS["half"], DEQ_IDS["words"])  # fp16 dequantization: both dots in fp16


def split_fits(fmt: int, head_dim: int, num_warps: int, side: str, split_q8: bool = False) -> bool:
    """Whether a q4_0 / tq3_0 side (q8_0 too with `split_q8`) can run "split": its parts ([N, W], W = D/4
    for q8_0 and q4_0, D/8 for tq3_0) must be dot operands (K: W >= 16), and for V wide enough that the
    p.v_j dots ([16, W] out, m16n8 tiles) keep every warp busy (W >= 8 x warps): narrower parts replicate
    the MMAs and the softmax across warps (offline sm_90a compile, head_dim 64: 32 HMMA a step against
    words' 8; docs/kv.md)."""
    parts = {FMT_IDS["q4_0"]: 4, FMT_IDS["tq3_0"]: 8, **({FMT_IDS["q8_0"]: 4} if split_q8 else {})}
    if fmt not in parts:
        return False
    width = head_dim // parts[fmt]
    return width >= (16 if side == "k" else 8 * num_warps)


def _schemes(cfg: LaunchConfig, fmt_k: int, fmt_v: int, in_dtype: torch.dtype, head_dim: int = 256) -> tuple[str, str]:
    """The dequantization schemes K and V run. The fp16 ones ("half", "words") need a 16-bit query
    and no dense side (both dots run in fp16): else the fp32 path, "flat" (q8_0) or "blocks_fast"
    (q4_0). A tq3_0 side under "half" runs blocks_fast (its fp32 values cast to fp16 for the dot),
    under "words" its own fp16 path. "split" runs on a q4_0 or tq3_0 side where
    `split_fits` and the query is 16-bit, also beside a dense side (its own dot in fp16: _dot_dtypes), and
    on a q8_0 side where cfg.split_q8 too; anywhere else it is "words"."""
    deq_k, deq_v = cfg.dequant, cfg.dequant_v or cfg.dequant
    fp32 = in_dtype == torch.float32 or fmt_k == 0 or fmt_v == 0

    def pick(deq: str, fmt: int, side: str) -> str:
        if deq == "split":
            if in_dtype != torch.float32 and split_fits(fmt, head_dim, cfg.num_warps, side, cfg.split_q8):
                return deq
            deq = "words"
        if DEQ_IDS[deq] not in HALF_SCHEMES:
            return deq
        if fmt == FMT_IDS["tq3_0"] and (fp32 or deq != "words") or fp32 and fmt == FMT_IDS["q4_0"]:
            return "blocks_fast"
        return "flat" if fp32 else deq

    return pick(deq_k, fmt_k, "k"), pick(deq_v, fmt_v, "v")


def _dot_dtypes(deq_k: str, deq_v: str, in_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """The operand types of q.k and of p.v for _schemes' choice: fp16 for both when a side runs "half"
    or "words" (else the query's type); a "split" side's own dot is fp16 whatever the other side runs
    (beside a dense side, that side's dot keeps the query's type: a bf16 V stays bf16)."""
    dot = torch.float16 if DEQ_IDS[deq_k] in HALF_SCHEMES or DEQ_IDS[deq_v] in HALF_SCHEMES else in_dtype
    return (torch.float16 if deq_k == "split" else dot), (torch.float16 if deq_v == "split" else dot)
