"""Q8_0 quantization in plain torch, on any device: gguf's quantizer, bit for bit.

For weights that arrive in bf16 and should sit on the GPU as GGUF blocks (a DFlash drafter's layers,
spec/dflash_model.py): gguf.quants.quantize runs in numpy on the CPU at ~7 M values/s, so a 1.7 B
parameter drafter would take minutes; this runs the same fp32 operations where the weight already
is. ggml's Q8_0 (ggml-quants.c quantize_row_q8_0_ref, gguf.quants.Q8_0.quantize_blocks): per block of
32 values d = max|x| / 127, id = 1 / d (0 when d is 0), q = roundf(x * id) rounding half away from
zero, stored as d in fp16 then the 32 int8 codes. IEEE fp32 division and products are exact
functions of their operands, so the codes and scales equal gguf's (tests/kernels/quant/test_quantize.py).
"""

from __future__ import annotations

import torch

Q8_0_VALUES, Q8_0_BYTES = 32, 34


def quantize_q8_0(w: torch.Tensor, max_rows: int = 1024) -> torch.Tensor:
    """w [N, K] (any float dtype, K a multiple of 32) -> blocks [N, K / 32 * 34] uint8 on w's device,
    rows as GGUF stores them (models.quant_linear.QuantLinear's layout). `max_rows` rows at a time
    bound the fp32 temporaries (a few copies of max_rows x K)."""
    if w.dim() != 2 or w.shape[1] % Q8_0_VALUES or not w.is_floating_point():
        raise ValueError(f"quantize_q8_0: w must be a float [N, K] with K a multiple of {Q8_0_VALUES}, got {w.dtype} {tuple(w.shape)}")
    n, k = w.shape
    out = torch.empty(n, k // Q8_0_VALUES, Q8_0_BYTES, dtype=torch.uint8, device=w.device)
    for i in range(0, n, max_rows):
        x = w[i : i + max_rows].float().reshape(-1, Q8_0_VALUES)  # [blocks, 32] fp32: bf16 / fp16 -> fp32 is exact
        d = x.abs().amax(dim=1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        y = x * inv
        a = y.abs()
        floored = torch.floor(a)
        q = torch.sign(y) * (floored + torch.floor(2 * (a - floored)))  # gguf's np_roundf: half away from zero
        rows = out[i : i + max_rows].view(-1, Q8_0_BYTES)
        rows[:, :2] = d.to(torch.float16).view(torch.uint8)
        rows[:, 2:] = q.to(torch.int8).view(torch.uint8)
    return out.view(n, k // Q8_0_VALUES * Q8_0_BYTES)
