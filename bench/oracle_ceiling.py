"""The engine's speculative ceiling at real shapes, with an ORACLE drafter (`--draft replay`).

Random weights say nothing about a real drafter's acceptance, so this runs the one drafter whose
acceptance is known: the target's own greedy continuation, replayed as chains of tau - 1 tokens
(spec/replay.py). Plain decoding and each replayed tau run one after another in one process on
the same prompt; the ratio of tokens/s is the ceiling of any drafter that reaches that tau with a
free draft. Labelled as an oracle in its output; tau is the measured one (a bf16 verify pass that
disagrees with plain decoding ends the replay, and shows here as a lower tau).

Random weights give flat logits: the top two of 150-250K random logits are so close that bf16's
verify pass (other kernels than the one-token step) picks another token within a few steps, and the
replay ends (H200, stop 45: tau 1.01-1.05 at every asked tau, 27B and 8B). So by default the random
model's logits get a fixed bias of `--held-bias` on one token (`--held-token`): every greedy token is
that token in plain decoding and in verify alike, and the replay holds. The bias is one add on the
head's output inside the same graphs; the layers, the cache and the verify pass run at their real
shapes on real (repeated) tokens, so the speed is the engine's. `--held-bias 0` measures without it.

    python -m bench.oracle_ceiling --shapes qwen3.5-27b,qwen3-8b --taus 4 8 16 --out oracle.json
    python -m bench.oracle_ceiling --shapes qwen3.5-27b:q4_k_m --gguf-dir /tmp/gguf --out oracle_q4.json
    python -m bench.oracle_ceiling --shapes tiny-dense --tokens 64 --out /tmp/oracle.json   # CPU check
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench.gpu_shapes import DEV, apply_tuning, load_shape, sync
from treeflash.spec.decoder import Decoder
from treeflash.spec.replay import ORACLE_NOTE, ReplayDrafter
from treeflash.spec.sampling import SamplingParams


def decode(model, cache, runner, prompt: list[int], n: int, drafter=None) -> tuple[list[int], float, float]:
    """(output tokens, decode seconds after the first token, tau)."""
    dec = Decoder(model, cache, SamplingParams(), drafter, runner=runner)
    out = [dec.prefill(prompt)]
    sync()
    t0 = time.perf_counter()
    while len(out) < n:
        out.extend(dec.step())
    sync()
    return out[:n], time.perf_counter() - t0, dec.stats.tau if drafter is not None else 1.0


def hold_head(model, token: int, bias: float) -> None:
    """Make `token` the greedy choice everywhere: the head's logits [T, vocab] get +bias there (an
    instance attribute over CausalLM.head, so the drafters' and the graphs' calls see it too)."""
    plain_head = model.head
    add = torch.zeros(model.config.vocab_size, device=model.device)
    add[token] = bias

    def head(hidden: torch.Tensor) -> torch.Tensor:
        return plain_head(hidden) + add

    model.head = head


def bench_shape(shape: str, args) -> dict:
    from treeflash.models.runner import CudaGraphRunner, EagerRunner

    model, extra, tuning = load_shape(shape, args.gguf_dir)
    model.fuse_projections()
    apply_tuning(model, tuning, extra)
    if args.held_bias:
        hold_head(model, args.held_token, args.held_bias)
    c = model.config
    top = max(args.taus)
    cache = model.new_cache(args.prompt_len + args.tokens + 2 * top + 64)
    buckets = tuple(sorted({1, *args.taus}))
    runner = CudaGraphRunner(model, cache, buckets=buckets) if DEV == "cuda" else EagerRunner(model, cache)
    torch.manual_seed(1)
    prompt = torch.randint(0, c.vocab_size, (args.prompt_len,)).tolist()
    decode(model, cache, runner, prompt, 16)  # warm-up
    ref, t_plain, _ = decode(model, cache, runner, prompt, args.tokens)
    plain_tps = (len(ref) - 1) / t_plain
    rows = []
    for tau in args.taus:
        drafter = ReplayDrafter(num_draft=tau - 1, vocab_size=c.vocab_size)
        drafter.add_record(prompt + ref)
        decode(model, cache, runner, prompt, 32, drafter)  # warm-up (graphs of this tree size)
        drafter.reset()
        out, t, measured = decode(model, cache, runner, prompt, args.tokens, drafter)
        tps = (len(out) - 1) / t
        rows.append({"tau_asked": tau, "tau": measured, "tokens_per_s": tps, "ratio_vs_plain": tps / plain_tps,
                     "same_as_plain": out == ref})
        print(f"[oracle] {shape}: tau {measured:.2f} (asked {tau}): {tps:.1f} tok/s, {tps / plain_tps:.2f}x plain "
              f"({plain_tps:.1f} tok/s){'' if out == ref else ', output differs from plain'}")
    return {"shape": shape, **extra, "held_token": args.held_token if args.held_bias else None,
            "held_bias": args.held_bias, "plain_tokens_per_s": plain_tps, "tokens": args.tokens, "prompt_len": args.prompt_len,
            "oracle": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3.5-27b",
                    help="comma-separated gpu_shapes.SHAPES names (random bf16) or SHAPE:MIX[@ROUTES] (a random GGUF kept in its blocks)")
    ap.add_argument("--gguf-dir", default="/tmp/gguf", help="where SHAPE:MIX files are found or written")
    ap.add_argument("--taus", type=int, nargs="+", default=[4, 8, 16], help="replayed chain lengths + 1")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--held-token", type=int, default=0, help="the token the head's bias makes greedy (see above)")
    ap.add_argument("--held-bias", type=float, default=1e4,
                    help="the bias on --held-token's logit; 0 runs the random model's own flat logits")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if min(args.taus) < 2:
        ap.error("--taus: each tau must be >= 2")
    res = {"tool": "oracle_ceiling", "oracle": ORACLE_NOTE, "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
           "shapes": [bench_shape(s, args) for s in args.shapes.split(",")]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
