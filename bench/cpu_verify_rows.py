"""Verify-pass time of the embedded default on the CPU at 1-5 nodes (one thread, 256 committed tokens, fp32):
the best of 4 passes after 2 warm-ups, two rounds. Prints one line: `TAG {nodes: [ms round 1, ms round 2]}`.

    OMP_NUM_THREADS=1 python bench/cpu_verify_rows.py now

docs/core.md ("3-row products on a CPU") compares the code before and after the row padding with it.
"""

from __future__ import annotations

import sys
import time

import torch

from treeflash.models.loader import load_model
from treeflash.models.step import StepInput

CONTEXT = 256


@torch.inference_mode()
def main(tag: str) -> None:
    torch.set_num_threads(1)
    model = load_model(None).model
    cache = model.new_cache(CONTEXT + 70)
    cache.seq_len = CONTEXT  # timing only: a zero prefix costs attention what real keys do

    def verify(n: int) -> None:
        ids = torch.randint(0, model.config.vocab_size, (n,))
        model(StepInput.chain(ids, CONTEXT), cache, compute_logits=True)
        cache.pending = 0  # drop the uncommitted nodes

    res: dict[int, list[float]] = {}
    for _ in range(2):
        for n in (1, 2, 3, 4, 5):
            for _ in range(2):
                verify(n)
            times = []
            for _ in range(4):
                t0 = time.perf_counter()
                verify(n)
                times.append(time.perf_counter() - t0)
            res.setdefault(n, []).append(round(min(times) * 1e3, 1))
    print(tag, res)


if __name__ == "__main__":
    main(sys.argv[1] if sys.argv[1:] else "now")
