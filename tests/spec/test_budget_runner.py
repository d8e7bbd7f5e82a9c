"""--budget auto on a GPU times the verify pass the decoder really runs (the runner's); the timing
passes leave the committed cache untouched."""

import torch

from tests.models.hf_oracle import make_pair
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.budget import runner_verify_timer
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams


def test_runner_timer_measures_and_leaves_the_cache_alone():
    for arch in ("qwen3", "qwen3_5"):
        _, model = make_pair(arch)
        prompt = torch.randint(0, 97, (12,)).tolist()

        def decode(timed: bool) -> list[int]:
            cache = model.new_cache(160)
            runner = CudaGraphRunner(model, cache, buckets=(1, 2, 4, 8, 16, 32, 64), use_graphs=False)
            dec = Decoder(model, cache, SamplingParams(), runner=runner)
            out = [dec.prefill(prompt)]
            for i in range(20):
                if timed and i == 5:
                    times = runner_verify_timer(runner, node_counts=(1, 4, 16), repeats=1)(cache.seq_len)
                    assert sorted(times) == [1, 4, 16] and all(t > 0 for t in times.values())
                out.extend(dec.step())
            return out

        assert decode(timed=True) == decode(timed=False), arch
