"""Random GGUF blocks with sane scales: weights for parity tests and speed runs without real files.

Every byte of a block is random except its fp16 scale fields, which get finite values of the
magnitude real checkpoints have (LLM weights are ~0.02: |d| times the largest code and sub-scale
lands near 0.1-1), so the dequantized weights are finite and products do not overflow. The K-quants'
small d includes fp16 subnormals, which exercises that conversion too.
"""

from __future__ import annotations

import torch

from treeflash.kernels.quant.formats import get_format

# byte offsets of the fp16 fields (d, dmin / m) inside one block, per ggml's block structs
SCALE_OFFSETS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,),
}
# log2 range of |d| per format: its largest code times its largest sub-scale, scaled to ~2^-3..2^-1
SCALE_LOG2: dict[str, tuple[float, float]] = {
    "Q4_0": (-10, -5), "Q4_1": (-10, -5), "Q5_0": (-11, -6), "Q5_1": (-11, -6), "Q8_0": (-13, -8),
    "Q2_K": (-9, -5), "Q3_K": (-13, -8), "Q4_K": (-15, -10), "Q5_K": (-16, -11), "Q6_K": (-18, -13),
    "IQ4_NL": (-13, -8), "IQ4_XS": (-18, -13),
}


def random_blocks(fmt: str, n: int, k: int, generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """uint8 [n, row_bytes(k)]: n rows of random fmt blocks whose fp16 scales are finite and realistic."""
    f = get_format(fmt)
    nb = n * (f.row_bytes(k) // f.block_bytes)
    blocks = torch.randint(0, 256, (nb, f.block_bytes), dtype=torch.uint8, generator=generator)
    for off in SCALE_OFFSETS[f.name]:
        mag = torch.exp2(torch.empty(nb, dtype=torch.float32).uniform_(*SCALE_LOG2[f.name], generator=generator))
        sign = torch.randint(0, 2, (nb,), generator=generator).float() * 2 - 1
        blocks[:, off:off + 2] = (mag * sign).to(torch.float16).view(torch.uint8).view(nb, 2)
    return blocks.reshape(n, f.row_bytes(k)).to(device)
