"""Checks of kernels/spec/draft_slots.py under TRITON_INTERPRET=1 (run by tests/kernels/spec/test_draft_slots.py in a
subprocess): the kernel's slots and cos / sin rows equal draft_slots_ref's, with and without a count, at
counts 0 < count < n, count = n and n = 1, for bf16 and fp32 tables."""

from __future__ import annotations

import json

import torch


def main() -> None:
    from treeflash.kernels.spec.draft_slots import draft_slots, draft_slots_ref

    out: dict[str, str | None] = {}
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        table = torch.randn(2, 120, 64, generator=gen).to(dtype)
        for n, b, count in ((16, 16, None), (16, 16, 5), (16, 16, 16), (1, 16, 1), (3, 8, 2), (16, 16, 1)):
            start = torch.tensor([37])
            c = None if count is None else torch.tensor([count])
            want = draft_slots_ref(start, c, n, b, 119, table)
            got = draft_slots(start, c, n, b, 119, table)
            name = f"{str(dtype)[6:]}_n{n}_b{b}_count{count}"
            if not torch.equal(got[0], want[0]):
                out[name] = f"slots {got[0].tolist()} != {want[0].tolist()}"
            elif not torch.equal(got[1], want[1]):
                out[name] = f"cos/sin differ by {(got[1].float() - want[1].float()).abs().max().item():.3g}"
            else:
                out[name] = None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
