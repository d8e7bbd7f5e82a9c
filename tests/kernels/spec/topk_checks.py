"""kernels/spec/topk.py's topk_logprobs against its reference under TRITON_INTERPRET=1 (run by
test_topk.py). Prints one JSON line: case -> None (ids equal, log-probs within 1e-5) or what differed.
The interpreter runs every program of the grid in Python: the shapes stay small (a 15 x 49152 case
with k = 48 alone would take ~30 s)."""

from __future__ import annotations

import json
import math

import torch


def planted(r: int, v: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """[r, v] logits in [-8, 0) (ties allowed: bf16 has few values there) with 64 distinct larger
    values 1 + j/128 (exact in bf16) at random places per row: the top 64 are unique, so their order
    is too."""
    x = torch.rand(r, v, generator=gen) * -8
    for i in range(r):
        x[i, torch.randperm(v, generator=gen)[:64]] = 1 + torch.randperm(64, generator=gen).float() / 128
    return x.to(dtype)


def compare(got, want) -> str | None:
    if not torch.equal(got[1], want[1]):
        return f"ids {got[1].tolist()} != {want[1].tolist()}"
    err = (got[0] - want[0]).abs().max().item()
    return None if err <= 1e-5 and got[0].dtype == torch.float32 and got[1].dtype == torch.long else f"log-probs off by {err}"


def main() -> None:
    from treeflash.kernels.spec.topk import topk_logprobs, topk_logprobs_reference

    gen = torch.Generator().manual_seed(0)
    out = {}
    # V = 1000: one chunk with a tail; 4106: two full chunks and a tail shorter than kp; 49152: the
    # default drafter's vocabulary (24 chunks: kp x 32 candidates in the merge)
    for r, v, k, dtype in [(1, 1000, 1, torch.float32), (3, 1000, 64, torch.bfloat16), (2, 4106, 64, torch.bfloat16),
                           (3, 8192, 8, torch.float32), (15, 8192, 48, torch.bfloat16), (1, 49152, 48, torch.bfloat16),
                           (3, 49152, 1, torch.float32), (1, 49152, 64, torch.float16)]:
        x = planted(r, v, dtype, gen)
        out[f"r{r}_v{v}_k{k}_{str(dtype)[6:]}"] = compare(topk_logprobs(x, k), topk_logprobs_reference(x, k))

    # ties: the lower index first
    lp, ids = topk_logprobs(torch.zeros(2, 3000, dtype=torch.bfloat16), 8)
    ok = ids.tolist() == [list(range(8))] * 2 and torch.allclose(lp, torch.full_like(lp, -math.log(3000)), atol=1e-5)
    out["ties_lower_index_first"] = None if ok else f"{ids.tolist()} {lp.tolist()}"

    # -inf logits (a masked vocabulary): no nan; the finite ones first, then -inf at the lowest ids
    x = torch.full((2, 5000), float("-inf"))
    x[0, 4321], x[0, 17], x[1, 2500] = 3.0, 1.0, 0.0
    lp, ids = topk_logprobs(x, 4)
    want_lp = torch.tensor([[-math.log1p(math.exp(-2)), -2 - math.log1p(math.exp(-2)), -math.inf, -math.inf],
                            [0.0, -math.inf, -math.inf, -math.inf]])
    ok = ids.tolist() == [[4321, 17, 0, 1], [2500, 0, 1, 2]] and torch.allclose(lp, want_lp, atol=1e-5)
    out["minus_inf_logits"] = None if ok else f"{ids.tolist()} {lp.tolist()}"

    # out=: written in place and returned
    x = planted(3, 3000, torch.float32, gen)
    bufs = (torch.full((3, 16), 7.0), torch.full((3, 16), -1, dtype=torch.long))
    got = topk_logprobs(x, 16, out=bufs)
    same = got[0] is bufs[0] and got[1] is bufs[1]
    out["out_in_place"] = compare(bufs, topk_logprobs_reference(x, 16)) if same else "did not return out"

    # bad arguments: a clear ValueError before any launch
    bad = []
    x = torch.zeros(2, 100)
    for what, call in [("k 0", lambda: topk_logprobs(x, 0)), ("k 65", lambda: topk_logprobs(torch.zeros(2, 500), 65)),
                       ("k > V", lambda: topk_logprobs(torch.zeros(2, 10), 11)), ("1-d", lambda: topk_logprobs(x[0], 4)),
                       ("int", lambda: topk_logprobs(x.long(), 4)), ("strided", lambda: topk_logprobs(x.t(), 1)),
                       ("out shape", lambda: topk_logprobs(x, 4, out=(torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.long)))),
                       ("out dtype", lambda: topk_logprobs(x, 4, out=(torch.zeros(2, 4), torch.zeros(2, 4))))]:
        try:
            call()
            bad.append(f"{what}: no error")
        except ValueError as e:
            if "topk_logprobs" not in str(e):
                bad.append(f"{what}: {e}")
    out["bad_arguments"] = None if not bad else "; ".join(bad)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
