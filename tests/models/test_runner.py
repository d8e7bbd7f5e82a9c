"""The static-shape runner (what CUDA graphs capture) decodes exactly like the eager runner.

On the CPU the static code runs without graph capture (use_graphs=False): same slots, key masks,
padding nodes, packed inputs and commit, so a bug there shows up here."""

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.oracle_drafter import OracleDrafter
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams


def run(model, prompt, n, drafter=None, static=False):
    cache = model.new_cache(len(prompt) + n + 40)
    runner = CudaGraphRunner(model, cache, buckets=(1, 2, 4, 8, 16), use_graphs=False) if static else None
    dec = Decoder(model, cache, SamplingParams(), drafter, runner=runner)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_static_runner_matches_eager(arch):
    _, model = make_pair(arch)
    prompt = torch.randint(0, 97, (10,)).tolist()
    ref = run(model, prompt, 40)
    assert run(model, prompt, 40, static=True) == ref  # plain decode through the static T=1 path
    out = run(model, prompt, 40, OracleDrafter(model, depth=4, width=2, corrupt=0.4), static=True)
    assert out == ref  # verify buckets with padding nodes, static commit
