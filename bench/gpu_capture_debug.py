"""Which operation breaks a CUDA-graph capture: the tiny hybrid (qwen3_5) target's DFlash drafter
passes are captured with every aten op and every Triton launch followed by a query of the stream's
capture status (cudaStreamIsCapturing), so the first op that invalidates the capture is named.

    python bench/gpu_capture_debug.py --arch qwen3_5 --out out/capture_debug.json

(gpu_check's DFlash section fails with 'operation failed due to a previous error during capture',
which names no op.)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.models.hf_oracle import make_pair  # noqa: E402
from tests.spec.test_dflash_model import random_drafter  # noqa: E402
from treeflash.models.runner import CudaGraphRunner  # noqa: E402
from treeflash.spec.dflash import DFlashDrafter  # noqa: E402

_STATUS = {0: "none", 1: "active", 2: "invalidated"}


def _cudart():
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libcudart not found")


class Watch:
    """Records ops while a capture is active; the first op after which the status is not 'active'."""

    def __init__(self):
        self.rt = _cudart()
        self.ops: list[str] = []
        self.first_bad: dict | None = None

    def status(self) -> str:
        st = ctypes.c_int(-1)
        self.rt.cudaStreamIsCapturing(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(st))
        return _STATUS.get(st.value, str(st.value))

    def after(self, name: str, before: str) -> None:
        now = self.status()
        self.ops.append(f"{name}: {before}->{now}")
        if before == "active" and now != "active" and self.first_bad is None:
            self.first_bad = {"op": name, "status": now, "stack": "".join(traceback.format_stack(limit=14)[:-2])}


class AtenWatch(TorchDispatchMode):
    def __init__(self, watch: Watch):
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.watch.status()
        out = func(*args, **(kwargs or {}))
        self.watch.after(f"aten {func}", before)
        return out


def patch_triton(watch: Watch):
    from triton.runtime.jit import JITFunction

    orig = JITFunction.run

    def run(self, *a, **k):
        before = watch.status()
        out = orig(self, *a, **k)
        watch.after(f"triton {self.fn.__name__} grid={k.get('grid')}", before)
        return out

    JITFunction.run = run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="qwen3_5")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--out", default="out/capture_debug.json")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    _, ours = make_pair(args.arch, dtype=dtype)
    ours = ours.cuda().fuse_projections()
    draft = random_drafter(ours).cuda().to(dtype)
    drafter = DFlashDrafter(ours, draft, budget=7, tree=False)
    cache = ours.new_cache(10 + 60 + 64)
    runner = CudaGraphRunner(ours, cache, capture_layers=drafter.capture_layers, buckets=(1, 2, 4, 8, 16, 32))
    watch = Watch()
    patch_triton(watch)
    res = {"arch": args.arch, "dtype": args.dtype}
    import treeflash.models.runner as runner_mod

    orig_capture = runner_mod.capture_graph

    def capture_graph(fn, pool, warmups: int = 2):
        return orig_capture(lambda: _watched(fn), pool, warmups)

    def _watched(fn):
        with AtenWatch(watch):
            return fn()

    import treeflash.spec.dflash_graph as dg

    dg.capture_graph = capture_graph
    try:
        drafter.static_passes(runner.max_len, True)
        res["captured"] = True
    except Exception as e:  # noqa: BLE001 - report it
        res["captured"] = False
        res["error"] = f"{type(e).__name__}: {e}"[:800]
        res["traceback"] = traceback.format_exc()[-3000:]
    res["first_bad"] = watch.first_bad
    res["last_ops"] = watch.ops[-60:]
    print(json.dumps({k: v for k, v in res.items() if k != "last_ops"}, indent=2), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
