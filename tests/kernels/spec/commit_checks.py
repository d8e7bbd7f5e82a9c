"""kernels/spec/commit.py against its references under TRITON_INTERPRET=1 (run by test_commit.py).
Prints one JSON line: case -> bitwise equal."""

from __future__ import annotations

import json

import torch


def main() -> None:
    from treeflash.kernels.spec.commit import (RowTable, commit_rows_table, conv_window_commit, conv_window_commit_reference,
                                               move_rows_reference)

    torch.manual_seed(0)
    out = {}
    # attention rows: a path with gaps, padded past n as the graph runner pads it; rows of 2 x w values.
    # "gaps" reads row 2 (j = 1) that j = 2 overwrites; "wide" has rows wider than one column block
    # (3 programs a buffer) and a bucket that is no power of two
    for name, path, pad, dtype, w in [("gaps", [0, 2, 5, 6], 8, torch.bfloat16, 24), ("chain", [0, 1, 2], 4, torch.float32, 24),
                                      ("root_only", [0], 4, torch.float16, 24), ("deep", [0, 3, 4, 9, 12], 16, torch.float32, 24),
                                      ("wide", [0, 1, 4, 6, 7, 9], 6, torch.bfloat16, 600)]:
        start = 7
        padded = path + [path[-1]] * (pad - len(path))
        src = torch.tensor(padded) + start
        dest = torch.arange(pad) + start
        n = torch.tensor([len(path)])
        k = torch.randn(40, 2, w).to(dtype)
        v = torch.randn(40, 2, w).to(dtype)
        k2, v2 = k.clone(), v.clone()
        commit_rows_table(RowTable([k, v]), dest, src, n)  # one layer's K and V
        move_rows_reference((k2, v2), dest, src, n)
        out[f"rows_{name}"] = bool(torch.equal(k, k2) and torch.equal(v, v2))
    # one table over several layers' K and V (bf16 and fp32 buffers of one row size in bytes: copied as int16):
    # every buffer's kept rows in one launch
    start, path, pad = 5, [0, 1, 3, 4, 8], 12
    src = torch.tensor(path + [path[-1]] * (pad - len(path))) + start
    dest = torch.arange(pad) + start
    n = torch.tensor([len(path)])
    bufs = [torch.randn(30, 3, 8).to(torch.bfloat16) for _ in range(4)] + [torch.randn(30, 3, 4)]
    refs = [b.clone() for b in bufs]
    commit_rows_table(RowTable(bufs), dest, src, n)
    for r in refs:
        r.index_copy_(0, dest[:5], r.index_select(0, src[:5]))
    out["table_five_buffers"] = all(torch.equal(b, r) for b, r in zip(bufs, refs))
    # conv windows: kept rows from the old window and from a strided view of the step's inputs
    for k1, rows in [(3, [2, 3, 5]), (3, [4, 5, 6]), (1, [3]), (4, [0, 1, 3, 4])]:
        c, t = 37, 6
        window = torch.randn(c, k1).to(torch.bfloat16)
        proj = torch.randn(t, c + 5).to(torch.bfloat16)  # the step's inputs have the window's dtype
        inputs = proj[:, 2 : 2 + c]  # a view with row stride c + 5, as split() leaves it
        w2 = window.clone()
        r = torch.tensor(rows)
        conv_window_commit(window, inputs, r)
        conv_window_commit_reference(w2, inputs, r)
        out[f"conv_k{k1}_{rows}"] = bool(torch.equal(window, w2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
