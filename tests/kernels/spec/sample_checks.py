"""kernels/spec/sample.py's sample_rows against its reference under TRITON_INTERPRET=1 (run by
test_sample.py). Prints one JSON line: case -> None (the same tokens) or what differed."""

from __future__ import annotations

import json

import torch

from treeflash.kernels.spec.sample import sample_rows, sample_rows_reference

# (vocab, dtype, temperature, min_p): a vocabulary that is not a multiple of the block, one that is,
# SmolLM2's; bf16 and fp32 logits; min-p off and on
CASES = [
    (1000, torch.float32, 1.0, 0.0),
    (4096, torch.float32, 0.6, 0.1),
    (9000, torch.bfloat16, 1.3, 0.0),
    (49152, torch.bfloat16, 1.0, 0.02),
]


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for vocab, dtype, temperature, min_p in CASES:
        n = 24
        logits = (torch.randn(n, vocab, generator=gen) * 4).to(dtype)
        logits[3] = -1e4  # a row with one token far ahead (min-p keeps only it)
        logits[3, 17] = 10.0
        fparams = torch.tensor([temperature, 2.0, min_p])
        seed, counter, index = torch.tensor([977]), torch.tensor([4]), torch.arange(n) * 3 + 1
        got = sample_rows(logits, fparams, seed, counter, index)
        want = sample_rows_reference(logits, fparams, seed, counter, index)
        name = f"v{vocab}-{str(dtype)[6:]}-t{temperature}-minp{min_p}"
        same = got.dtype == torch.long and torch.equal(got, want)
        out[name] = None if same else f"kernel {got.tolist()} reference {want.tolist()}"
    # a NaN row (no kept token) still draws an id inside the vocabulary
    bad = torch.full((2, 1000), float("nan"))
    got = sample_rows(bad, torch.tensor([1.0, 2.0, 0.0]), torch.tensor([1]), torch.tensor([0]), torch.arange(2))
    out["nan-row"] = None if bool(((got >= 0) & (got < 1000)).all()) else f"ids {got.tolist()}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
