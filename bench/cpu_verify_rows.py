"""Verify-pass time of the embedded default on the CPU at 1-5 nodes (one thread, 256 committed tokens, fp32):
the best of 4 passes after 2 warm-ups, two rounds. Prints one line: `TAG {nodes: [ms round 1, ms round 2]}`.

    OMP_NUM_THREADS=1 python bench/cpu_verify_rows.py now

docs/core.md ("3-row products on a CPU") compares the code before and after the row padding with it.
"""
import sys
import time

import torch

from treeflash.models.loader import load_model
from treeflash.models.step import StepInput
m = load_model(None); model = m.model
torch.set_num_threads(1)
ctx=256
cache = model.new_cache(ctx+70); cache.seq_len = ctx
def verify(n):
    ids = torch.randint(0, model.config.vocab_size, (n,))
    model(StepInput.chain(ids, ctx), cache, compute_logits=True); cache.pending = 0
with torch.inference_mode():
  res = {}
  for rnd in range(2):
    for n in (1,2,3,4,5):
      for _ in range(2): verify(n)
      ts=[]
      for _ in range(4):
        t=time.perf_counter(); verify(n); ts.append(time.perf_counter()-t)
      res.setdefault(n, []).append(round(min(ts)*1e3,1))
  print(sys.argv[1] if sys.argv[1:] else "now", res)
