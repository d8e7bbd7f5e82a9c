"""Time to first token with and without a prefix-cache hit, and the outputs it must not change.

    python -m treeflash.bench.prefix_cache --out prefix_cache.json                 # CPU, the default model
    python -m treeflash.bench.prefix_cache --device cuda --out $OUT/prefix_cache.json
    python -m treeflash.bench.prefix_cache --model ./Qwen3.5-0.8B --prefix-tokens 4096 --draft ngram --out x.json

An agent's turn: a long shared prefix (system prompt, tools, history: --prefix-tokens) then a new
question. Per run, the cache is cleared, the first turn prefills everything (a miss), and a
second turn with the same prefix and another question resumes it (a hit). Time to first token is
the engine's own (prefill + the first token's pick). The same two turns on an engine without
the cache give the reference outputs at temperature 0: `outputs_identical` must be true.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

FILLER = ("The build system reads the manifest, resolves each dependency to a pinned version, and writes the lock file. "
          "Tests run on every change; a failing test blocks the merge until someone fixes the cause. ")


def shared_prefix(engine, tokens: int) -> list[int]:
    """`tokens` ids of varied text (numbered lines, so no two lines tokenize alike)."""
    ids: list[int] = []
    line = 0
    while len(ids) < tokens:
        ids += engine.encode(f"[{line}] {FILLER}", add_special_tokens=False)
        line += 1
    return ids[:tokens]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m treeflash.bench.prefix_cache", description=__doc__.splitlines()[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--model", default=None, help="Hugging Face directory or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--prefix-tokens", type=int, default=4096, help="the shared prefix (default 4096)")
    p.add_argument("--max-tokens", type=int, default=16, help="output tokens per turn (default 16)")
    p.add_argument("--runs", type=int, default=3, help="miss + hit pairs measured (default 3)")
    p.add_argument("--draft", default=None, help="a drafter (ngram, dflash, mtp, ...): the hit must stay exact with it")
    p.add_argument("--prefix-cache-mb", type=float, default=512.0)
    p.add_argument("--threads", type=int, default=None, help="PyTorch CPU threads (default: PyTorch's)")
    args = p.parse_args(argv)

    import torch

    from treeflash.bench.machine import machine, versions
    from treeflash.engine.engine import Engine, EngineConfig
    from treeflash.engine.prefix_cache import PrefixCacheConfig
    from treeflash.engine.request import GenerationRequest
    from treeflash.models.loader import load_model
    from treeflash.spec.sampling import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device=args.device, progress=False)
    context = args.prefix_tokens + 256
    if context > loaded.config.max_position_embeddings:
        print(f"error: --prefix-tokens {args.prefix_tokens} + 256 is over the model's {loaded.config.max_position_embeddings} "
              "positions", file=sys.stderr)
        return 2
    cached = Engine(loaded, EngineConfig(max_context=context, draft=args.draft, prefix_cache=PrefixCacheConfig(args.prefix_cache_mb)))
    plain = Engine(loaded, EngineConfig(max_context=context, draft=args.draft))
    prefix = shared_prefix(cached, args.prefix_tokens)
    turns = [prefix + cached.encode(q, add_special_tokens=False) for q in
             ("\nQuestion: what blocks a merge?\nAnswer:", "\nQuestion: what does the lock file hold?\nAnswer:")]

    def turn(engine, ids):
        _, out, last = engine.complete(GenerationRequest(tuple(ids), SamplingParams(temperature=0.0), args.max_tokens, ignore_eos=True))
        return out, last.usage

    turn(cached, turns[0][:64])  # warm-up (kernels, allocations), then measured from a cleared cache
    miss_s, hit_s, hits = [], [], []
    outputs = None
    for _ in range(args.runs):
        cached.prefix.clear()
        out_a, miss = turn(cached, turns[0])
        out_b, hit = turn(cached, turns[1])
        miss_s.append(miss.first_token_s)
        hit_s.append(hit.first_token_s)
        hits.append(hit.cached_tokens)
        outputs = (out_a, out_b)
    reference = (turn(plain, turns[0])[0], turn(plain, turns[1])[0])
    first, second = statistics.median(miss_s), statistics.median(hit_s)
    result = {
        "bench": "prefix_cache",
        "command": "python -m treeflash.bench.prefix_cache " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": loaded.source, "device": args.device, "draft": args.draft,
        "prefix_tokens": args.prefix_tokens, "prompt_tokens": [len(t) for t in turns], "runs": args.runs,
        "ttft_miss_s": miss_s, "ttft_hit_s": hit_s, "ttft_miss_median_s": first, "ttft_hit_median_s": second,
        "ttft_ratio": first / second if second > 0 else None, "cached_tokens": hits,
        "outputs_identical": outputs == reference,
        "machine": machine(), "versions": versions(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"time to first token: miss {first:.3f} s, hit {second:.3f} s ({result['ttft_ratio']:.1f}x), "
          f"cached {hits[-1]} of {len(turns[1])} tokens, outputs identical: {result['outputs_identical']}")
    return 0 if result["outputs_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
