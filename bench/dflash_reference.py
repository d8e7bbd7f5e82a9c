"""treeflash's DFlash chain against the `dflash` reference package on identical work.

Same target weights, same drafter weights, same prompts, greedy: the reference's
`dflash_generate` (z-lab's loop: transformers target with a DynamicCache, the drafter's own
cache, hidden states of every verify pass) against treeflash's Decoder with a DFlashDrafter in
chain mode (budget = block_size - 1: exactly the reference's one block per pass). Both should
emit the same tokens with the same acceptance, so the tokens/s ratio is engine speed alone.

The reference's target is transformers' model built over treeflash's weight tensors (the
training twin, `treeflash.train.features`), its drafter `dflash.model.DFlashDraftModel` loaded
from the same z-lab-format directory. Prompts alternate the order of the two engines (ABBA).
On CUDA treeflash runs with its CUDA-graph runner and the reference as published (eager).

    python -m bench.dflash_reference --drafter treeflash/assets/smollm2_dflash --num-prompts 10 \
        --max-tokens 128 --threads 1 --out bench/results/dflash_reference_cpu.json

With `--random-shape qwen3-8b` the target is a random-weight model at that shape (bench/gpu_speed.py)
and the drafter a random one (`--draft-layers`, `--block-size`) written to a temporary directory;
the prompts are random token ids and nothing stops early. Acceptance is then ~0 for both, but
every step still drafts a block and verifies `block_size` tokens in both engines: the same work,
so tokens/s compares the engines (the issue's setting: 5 draft layers, 16-token verify, 8B shape).

    python -m bench.dflash_reference --random-shape qwen3-8b --draft-layers 5 --block-size 16 \
        --num-prompts 4 --max-tokens 128 --out bench/results/dflash_reference_gpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch


from treeflash.data.prompts import encode_prompt
from treeflash.models.loader import load_model
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.dflash import DFlashDrafter
from treeflash.spec.dflash_model import load_dflash
from treeflash.train.evaluate import BUCKETS, Config, decode
from treeflash.train.features import _build_twin
from treeflash.train.prompts import heldout_prompts


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reference_generate(ref_model, twin, ids: list[int], max_tokens: int, eos: set[int]):
    """-> (tokens, decode seconds, acceptance lengths) of dflash.model.dflash_generate."""
    import dflash.model as ref

    dev = twin.device
    if dev.type != "cuda":  # its timer synchronizes CUDA unconditionally
        ref._cuda_time = time.perf_counter
    out = ref.dflash_generate(ref_model, twin, torch.tensor([ids], device=dev), max_tokens, sorted(eos) or None, return_stats=True)
    toks = out.output_ids[0, len(ids):].tolist()
    decode_s = out.time_per_output_token * out.num_output_tokens
    end = next((i for i, t in enumerate(toks) if t in eos), None)
    return (toks if end is None else toks[: end + 1]), decode_s, out.acceptance_lengths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="the target (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", default=None, help="a DFlash drafter directory (z-lab format)")
    p.add_argument("--random-shape", default=None, help="a random-weight target at a bench/gpu_speed.py shape instead, e.g. qwen3-8b")
    p.add_argument("--draft-layers", type=int, default=5, help="with --random-shape: the random drafter's layers")
    p.add_argument("--block-size", type=int, default=16, help="with --random-shape: the random drafter's block size")
    p.add_argument("--eager-drafter", action="store_true", help="run our drafter's passes eagerly (the target still uses CUDA graphs)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="with --random-shape: random prompt length")
    p.add_argument("--num-prompts", type=int, default=10, help="the first N held-out prompts")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if (args.drafter is None) == (args.random_shape is None):
        p.error("give --drafter (with a real --target or the default) or --random-shape")
    from dflash.model import DFlashDraftModel

    tmp = None
    if args.random_shape:
        model, drafter_dir, prompts, eos, tmp = random_setup(args)
        source = f"random {args.random_shape}"
    else:
        loaded = load_model(args.target, device=args.device, progress=False)
        model, drafter_dir, source = loaded.model, args.drafter, loaded.source
        eos = set(loaded.config.eos_token_ids) | ({loaded.tokenizer.eos_token_id} if loaded.tokenizer.eos_token_id is not None else set())
        prompts = [(pr.name, encode_prompt(loaded, pr)) for pr in heldout_prompts()[: args.num_prompts]]
    dev = model.device
    twin = _build_twin(model)  # transformers over the same tensors (before fusing: fusion copies)
    ref_model = DFlashDraftModel.from_pretrained(drafter_dir, dtype=model.dtype).to(dev).eval()
    ours = load_dflash(drafter_dir, dev, model.dtype)
    if dev.type == "cuda":
        model.fuse_projections()
    max_len = max(len(ids) for _, ids in prompts) + args.max_tokens + 80
    cfg = Config("treeflash", DFlashDrafter(model, ours, budget=ours.config.block_size - 1, tree=False))
    cfg.cache = model.new_cache(max_len)
    if dev.type == "cuda":
        cfg.runner = CudaGraphRunner(model, cfg.cache, capture_layers=cfg.drafter.capture_layers, buckets=BUCKETS)
        if not args.eager_drafter:
            cfg.drafter.bind_runner(cfg.runner)  # the drafter's passes as CUDA graphs too
    with torch.inference_mode():  # warm up both
        decode(model, cfg, prompts[0][1], 16, eos)
        reference_generate(ref_model, twin, prompts[0][1], 16, eos)
        real_weights = args.random_shape is None
        rows, tot = [], {"ours_s": 0.0, "ref_s": 0.0, "ours_tokens": 0, "ref_tokens": 0, "ours_passes": 0, "ref_passes": 0}
        for i, (name, ids) in enumerate(prompts):
            def run_ours():
                cfg.stats = type(cfg.stats)()
                toks, _, dec_s, stats = decode(model, cfg, ids, args.max_tokens, eos)
                return toks, dec_s, stats

            order = ("ours", "ref") if i % 2 == 0 else ("ref", "ours")
            res = {}
            for who in order:
                sync(dev)
                res[who] = run_ours() if who == "ours" else reference_generate(ref_model, twin, ids, args.max_tokens, eos)
            (o_toks, o_s, o_stats), (r_toks, r_s, r_acc) = res["ours"], res["ref"]
            n = min(len(o_toks), len(r_toks))
            row = {"prompt": name, "ours_tokens": len(o_toks), "ref_tokens": len(r_toks),
                   "identical": o_toks[:n] == r_toks[:n] and len(o_toks) == len(r_toks),
                   "first_mismatch": next((j for j in range(n) if o_toks[j] != r_toks[j]), None),
                   "ours_passes": o_stats.passes, "ref_passes": len(r_acc),
                   "ours_tokens_per_s": round(len(o_toks) / o_s, 2), "ref_tokens_per_s": round(len(r_toks) / r_s, 2)}
            if real_weights:  # tau means nothing on random weights (they accept nothing): passes say the work matched
                row["ours_tau"] = round(len(o_toks) / max(o_stats.passes, 1), 3)
                row["ref_tau"] = round(len(r_toks) / max(len(r_acc), 1), 3)
            rows.append(row)
            tot["ours_s"] += o_s
            tot["ref_s"] += r_s
            tot["ours_tokens"] += len(o_toks)
            tot["ref_tokens"] += len(r_toks)
            tot["ours_passes"] += o_stats.passes
            tot["ref_passes"] += len(r_acc)
            print(f"[{i + 1}/{len(prompts)}] {name}: ours {row['ours_tokens_per_s']} tok/s, {row['ours_passes']} passes | "
                  f"reference {row['ref_tokens_per_s']} tok/s, {row['ref_passes']} passes | identical {row['identical']}", flush=True)
            summary = {
                "prompts": len(rows),
                "identical": f"{sum(r['identical'] for r in rows)}/{len(rows)}",
                "ours_tokens_per_s": round(tot["ours_tokens"] / tot["ours_s"], 2),
                "ref_tokens_per_s": round(tot["ref_tokens"] / tot["ref_s"], 2),
                "speedup_vs_reference": round((tot["ours_tokens"] / tot["ours_s"]) / (tot["ref_tokens"] / tot["ref_s"]), 3),
                "ours_passes": tot["ours_passes"],
                "ref_passes": tot["ref_passes"],
            }
            if real_weights:
                summary["ours_tau"] = round(tot["ours_tokens"] / max(tot["ours_passes"], 1), 3)
                summary["ref_tau"] = round(tot["ref_tokens"] / max(tot["ref_passes"], 1), 3)
            report = {"bench": "dflash_reference", "target": source, "drafter": args.drafter or "random", "device": str(dev),
                      "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None, "dtype": str(model.dtype),
                      "threads": torch.get_num_threads(), "torch": torch.__version__, "platform": platform.platform(),
                      "cuda_graphs": cfg.runner is not None, "drafter_graphs": cfg.drafter.graphs is not None and cfg.drafter.graphs.use_graphs, "max_tokens": args.max_tokens, "command": " ".join(sys.argv),
                      "summary": summary, "per_prompt": rows}
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))
    if tmp is not None:
        tmp.cleanup()


def random_setup(args):
    """-> (random target, random drafter directory, random prompts, no end tokens, the temp dir)."""
    import tempfile

    from bench.gpu_shapes import build_model

    from treeflash.spec.dflash_model import DFlashModel
    from treeflash.train.export import export_drafter
    from treeflash.train.recipe import drafter_config
    from treeflash.train.trainer import init_weights

    dev = "cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = build_model(args.random_shape, device=dev, dtype=dtype)
    c = model.config
    draft = DFlashModel(drafter_config(c, args.draft_layers, args.block_size, c.vocab_size - 1))
    init_weights(draft, seed=1)
    tmp = tempfile.TemporaryDirectory(prefix="dflash_ref_")
    export_drafter(draft, tmp.name, c.num_layers, c.vocab_size, dtype)
    g = torch.Generator().manual_seed(0)
    prompts = [(f"random/{i}", torch.randint(0, c.vocab_size - 1, (args.prompt_tokens,), generator=g).tolist())
               for i in range(args.num_prompts)]
    return model, tmp.name, prompts, set(), tmp


if __name__ == "__main__":
    main()
