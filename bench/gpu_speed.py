"""GPU speed of treeflash at real model shapes with random weights (speed does not depend on
weight values; acceptance does, so no tau is reported here).

Reports, per shape: decode tokens/s through the CUDA-graph runner and its fraction of the
measured copy bandwidth (bytes per token = every weight read once + the KV/state read); verify
step time for 1..128 nodes as a ratio to the one-token decode step; prefill tokens/s; and, for the
dense shape, transformers' generate on the same weights. Writes JSON.

Quantized rows (--quant SHAPE:MIX,...): the same measurements on a random-weight GGUF of that shape and
type mix (treeflash/models/gguf_synth.py), written into --gguf-dir on first use and loaded with its
matrices kept in their GGUF blocks where treeflash.kernels.quant has a kernel (the CPU: every matrix,
through the reference path); the roofline counts the bytes actually read (blocks + scales + the float
tensors + KV + state), and "weights" says per type how many matrices stayed quantized. A suffix
@GEMV/ROWS[/Q6ROWS] picks the kernels (QuantTuning.q4k_gemv_route at M == 1, q4k_rows_route at 2..128 rows,
q6k_rows_route for Q6_K at 2..128 rows), so routes compare side by side in one run: qwen3.5-27b:q4_k_m,qwen3.5-27b:q4_k_m@q4k/q4k.

    python -m bench.gpu_speed --shapes qwen3-8b,qwen3.5-27b --out bench/results/gpu_speed.json
    python -m bench.gpu_speed --shapes qwen3.5-27b,qwen3-8b --quant qwen3.5-27b:q4_k_m,qwen3.5-27b:ud-q3_k_xl,qwen3-8b:q4_k_m \
        --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" --out $OUT/gpu_speed_quant.json
    python -m bench.gpu_speed --shapes tiny-hybrid --quant tiny-hybrid:q4_k_m,tiny-dense:q4_k_m --buckets 1,4 \
        --prefill "" --decode-tokens 4 --drafter-layers 0 --out /tmp/gpu_speed_toy.json   # CPU check
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch


from bench.gpu_shapes import (DEV, apply_tuning, cuda_time, load_shape, measure_bandwidth, random_drafter, step_bytes, sync,
                        wall_time, weight_bytes)
from treeflash.engine.stack import build_runner
from treeflash.models.runner import CudaGraphRunner
from treeflash.models.step import StepInput
from treeflash.models.transformer import CausalLM
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams

def ddtree_parents(n: int) -> list[int]:
    """A DDTree-shaped verify tree of n nodes: depth round(2 log2 n) (16 -> 8, 32 -> 10, 64 -> 12,
    128 -> 14), wider near the root (widths falling linearly with depth), every depth's nodes
    children of the previous depth's first node (the main path), like the best-first tree of a
    drafter that is often right."""
    import math

    depth = max(1, min(n - 1, round(2 * math.log2(n))))
    weights = [depth - d for d in range(depth)]
    widths = [max(1, (n - 1) * w // sum(weights)) for w in weights]
    d = 0
    while sum(widths) < n - 1:  # the remainder near the root
        widths[d % depth] += 1
        d += 1
    while sum(widths) > n - 1:
        widths[max(range(depth), key=lambda i: widths[i])] -= 1
    parents, main = [-1], 0
    for w in widths:
        first = len(parents)
        parents.extend([main] * w)
        main = first
    return parents


def max_depth(parents: list[int]) -> int:
    depth = [0] * len(parents)
    for i, p in enumerate(parents[1:], 1):
        depth[i] = depth[p] + 1
    return max(depth)


@torch.inference_mode()
def bench_shape(shape: str, args, bandwidth: float) -> dict:
    dev = DEV
    model, extra, tuning = load_shape(shape, args.gguf_dir)  # SHAPE:MIX[@GEMV/ROWS[/Q6ROWS]]: a random GGUF, the quant kernel routes
    for m in model.modules():  # --no-fla: every Gated DeltaNet layer prefills through the torch reference
        if hasattr(m, "use_fla"):
            m.use_fla = args.fla
    if not args.unfused:
        # --folded-decode: one-token steps through forward_folded where the model is foldable (dense
        # attention-only; the hybrid 27B shape is not): an opt-in measured against the default
        folded = (args.folded_decode and model.foldable()) if args.folded_decode is not None else None
        model.fuse_projections(folded_decode=folded, gemv_tables=gemv_tables(args))
    apply_tuning(model, tuning, extra)
    c = model.config
    res: dict = {"shape": shape, "folded_decode": model.folded_decode, "params_b": sum(p.numel() for p in model.parameters()) / 1e9,
                 "weight_gb": weight_bytes(model) / 1e9, **extra}
    ctx = args.context
    need = ctx + 2 * max(args.buckets) + args.decode_tokens + 64
    cache = model.new_cache(max(need, args.cache_len or 0))  # --cache-len: a server-sized buffer (the graphs read only its filled part)
    t0 = time.perf_counter()
    runner = build_runner(model, cache, buckets=tuple(args.buckets))
    res["capture_s"] = time.perf_counter() - t0
    prompt = torch.randint(0, c.vocab_size, (ctx,), device=dev)
    runner.forward(StepInput.plain(prompt, 0), compute_logits=False)
    sync()

    # plain decode: graph replay + the greedy token read back, as the decoder does it (the token goes
    # in from the host with the step's other ints; the graph computes the argmax)
    tok = torch.zeros(1, dtype=torch.long)

    def decode_one():
        out = runner.forward(StepInput.plain(tok, cache.seq_len))
        return int(out.argmax[0])

    base = cache.seq_len
    t_decode = wall_time(decode_one, iters=args.decode_tokens)
    g_decode = cuda_time(lambda: runner.decode.replay(), iters=20)
    nbytes = step_bytes(model, cache, cache.seq_len)
    res["decode"] = {
        "context": ctx,
        "cache_slots": cache.max_len,
        "tokens_per_s": 1 / t_decode,
        "step_ms": t_decode * 1e3,
        "graph_ms": g_decode * 1e3,
        "bytes_per_token_gb": nbytes / 1e9,
        "roofline_tokens_per_s": bandwidth / nbytes,
        "fraction_of_roofline": (nbytes / t_decode) / bandwidth,
        "graph_fraction_of_roofline": (nbytes / g_decode) / bandwidth,
    }
    cache.seq_len = base  # the replays above appended tokens; rewind (attention-only positions; states are junk anyway)

    # the same through the Decoder, as `generate` runs greedy plain decoding: step k + 1 is enqueued
    # (its token taken on the device) before step k's token is read back (runner.enqueue_greedy)
    dec = Decoder(model, cache, SamplingParams(), runner=runner)
    dec.prefill(prompt.tolist())
    for _ in range(3):
        dec.step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.decode_tokens):
        dec.step()
    t_pipe = (time.perf_counter() - t0) / args.decode_tokens
    res["decode"].update({"pipelined_tokens_per_s": 1 / t_pipe, "pipelined_step_ms": t_pipe * 1e3,
                          "pipelined_fraction_of_roofline": (nbytes / t_pipe) / bandwidth})
    sync()
    cache.reset()
    runner.forward(StepInput.plain(prompt, 0), compute_logits=False)
    base = cache.seq_len

    # verify of n nodes: a chain (the deepest tree: the Gated DeltaNet tree recurrence is sequential
    # along a path), and for 16+ nodes also a DDTree-shaped tree (ddtree_parents); then the greedy
    # tokens read back and a commit of 4 nodes (a typical accepted path), as the decoder does it
    verify, verify_tree = {}, {}
    for n in args.buckets:
        ids = torch.randint(0, c.vocab_size, (n,))
        shapes = [("chain", list(range(-1, n - 1)), verify)] + ([("tree", ddtree_parents(n), verify_tree)] if n >= 16 else [])
        for kind, parents, into in shapes:
            keep = [0]
            for i in range(1, n):  # the first child at each depth: a root-to-node path of up to 4 nodes
                if parents[i] == keep[-1] and len(keep) < 4:
                    keep.append(i)

            def one():
                out = runner.forward(StepInput.tree(ids, parents, cache.seq_len))
                out.argmax.tolist()
                runner.commit(keep)
                cache.seq_len -= len(keep)  # rewind: the cache is sized for one step's growth

            t = wall_time(one, iters=10)
            g = cuda_time(lambda: runner.graphs[n].replay(), iters=10)
            into[n] = {"step_ms": t * 1e3, "graph_ms": g * 1e3, "ratio_to_decode_step": t / t_decode, "graph_ratio": g / g_decode,
                       "depth": max_depth(parents), "committed": len(keep)}
    res["verify"] = verify
    res["verify_tree"] = verify_tree

    # prefill (eager, chunked)
    prefill = {}
    for n in args.prefill:
        pc = model.new_cache(n + 8)
        ids = torch.randint(0, c.vocab_size, (n,), device=dev)

        def pre():
            pc.reset()
            for s in range(0, n, args.prefill_chunk):
                model(StepInput.plain(ids[s : s + args.prefill_chunk], s), pc, compute_logits=False)
            sync()

        try:
            t = wall_time(pre, iters=2, warmup=1)
            prefill[n] = {"tokens_per_s": n / t, "seconds": t}
        except torch.OutOfMemoryError as e:
            prefill[n] = {"error": str(e)[:200]}
        del pc
        if DEV == "cuda":
            torch.cuda.empty_cache()
    res["prefill"] = prefill

    if args.drafter_layers:
        res["drafter"] = bench_drafter(model, runner, args)

    if args.hf and c.arch == "qwen3" and ":" not in shape:
        res["transformers"] = bench_transformers(model, args)
    del runner, cache, model
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return res


@torch.inference_mode()
def bench_drafter(model: CausalLM, runner: CudaGraphRunner, args) -> dict:
    """One DFlash drafting pass (random drafter, `--drafter-layers` layers, block `--block-size`):
    eager (every op launched from the host) against its CUDA graph, n new context rows per pass
    (what a step that committed n tokens hands over), at a `--context`-row draft context. Each pass
    ends with what the decoder reads back: the logits (eager) or the packed top-k (graph)."""
    drafter = random_drafter(model, args.drafter_layers, args.block_size)
    draft = drafter.model
    width = len(draft.config.target_layer_ids) * model.config.hidden_size
    ctx = torch.randn(args.context, width, device=model.device, dtype=model.dtype)
    t0 = time.perf_counter()
    drafter.static_passes(runner.max_len)
    capture_s = time.perf_counter() - t0
    res = {"draft_layers": args.drafter_layers, "block_size": args.block_size, "context": args.context,
           "draft_params_m": sum(p.numel() for p in draft.parameters()) / 1e6, "capture_s": capture_s, "passes": {}}
    for n in sorted({1, 4, args.block_size}):
        rows = torch.randn(n, width, device=model.device, dtype=model.dtype)

        def setup():
            drafter.reset()
            drafter.observe([0] * args.context, ctx)
            drafter.draft_logits(0)  # the prompt's pass (eager: more rows than a block)

        def eager():
            drafter.observe([0] * n, rows)
            drafter.draft_logits(0).argmax(-1).tolist()
            drafter.cache.length -= n

        def graph():
            drafter.observe([0] * n, rows)
            p = drafter._static_pass(0)
            p.packed.cpu()
            drafter.cache.length -= n

        setup()
        graphs, drafter.graphs = drafter.graphs, None
        t_eager = wall_time(eager, iters=20)
        drafter.graphs = graphs
        t_graph = wall_time(graph, iters=20)
        g_only = cuda_time(lambda: graphs.passes[n].replay(), iters=20)
        res["passes"][n] = {"eager_ms": t_eager * 1e3, "graph_ms": t_graph * 1e3, "graph_replay_ms": g_only * 1e3}
    del drafter, draft
    return res


@torch.inference_mode()
def bench_transformers(model: CausalLM, args) -> dict:
    """transformers' generate on the same weights (shared, not copied)."""
    import transformers as tf

    c = model.config
    hcfg = tf.Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
                          head_dim=c.head_dim, rope_theta=c.rope_theta, max_position_embeddings=c.max_position_embeddings,
                          tie_word_embeddings=False, torch_dtype="bfloat16")
    with torch.device("meta"):
        hf = tf.Qwen3ForCausalLM(hcfg)
    hf.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("rotary")}, assign=True, strict=False)
    hf.model.rotary_emb = type(hf.model.rotary_emb)(hcfg, device="cuda")
    hf = hf.to("cuda").eval()
    ids = torch.randint(0, c.vocab_size, (1, args.context), device="cuda")
    out = {}
    # "static": transformers compiles the forward itself for a static cache (its fastest documented
    # setting); the first calls compile and capture, so it is warmed up with two full-length runs
    # and the third is timed. Compiling hf.forward by hand on top of that fails (a CUDA-graph output
    # read after the next replay overwrote it: seen on the H200, transformers 5.17).
    stamps: list[float] = []

    class _Stamp(tf.LogitsProcessor):  # one host timestamp per generated token (generate syncs every step anyway)
        def __call__(self, input_ids, scores):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return scores

    for mode in ["eager_dynamic"] + (["static"] if args.hf_compile else []):
        kw = dict(max_new_tokens=args.hf_tokens, min_new_tokens=args.hf_tokens, do_sample=False,
                  logits_processor=tf.LogitsProcessorList([_Stamp()]))
        if mode == "static":
            kw["cache_implementation"] = "static"
        try:
            t0 = time.perf_counter()
            for _ in range(1 if mode == "eager_dynamic" else 2):
                hf.generate(ids, **kw)  # warm up / compile at the timed shapes
            torch.cuda.synchronize()
            warm = time.perf_counter() - t0
            stamps.clear()
            t0 = time.perf_counter()
            hf.generate(ids, **kw)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            # decode rate from the per-token stamps: the first stamp follows the prefill
            per_token = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
            out[mode] = {"tokens_per_s": 1.0 / per_token, "step_ms": per_token * 1e3, "warmup_s": warm,
                         "end_to_end_tokens_per_s": args.hf_tokens / dt, "tokens": args.hf_tokens,
                         "note": "tokens_per_s: decode steps only (host stamps between tokens); end_to_end includes the prefill"}
        except Exception as e:  # report, do not hide
            out[mode] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(f"  transformers {mode}: {out[mode]}", flush=True)
    return out


def gemv_tables(args):
    """The GEMV shape tables the models get: the shipped ones (--no-swiglu: gate_up on cuBLAS + silu_mul)."""
    from treeflash.kernels.linear import gemv

    return gemv.TUNED if args.swiglu else gemv.TUNED.without_swiglu()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="qwen3-8b,qwen3.5-27b")
    p.add_argument("--quant", default="", help="quantized rows after --shapes: SHAPE:MIX,... (mixes of treeflash/models/gguf_synth.py, "
                                                 "e.g. qwen3.5-27b:q4_k_m,qwen3.5-27b:ud-q3_k_xl,qwen3-8b:q4_k_m)")
    p.add_argument("--gguf-dir", default="/tmp/treeflash-gguf", help="where --quant's random GGUF files are written and reused")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--cache-len", type=int, default=None, help="KV cache slots to allocate (default: just enough for the run)")
    p.add_argument("--buckets", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16, 32, 64, 128])
    p.add_argument("--prefill", type=lambda s: [int(x) for x in s.split(",") if x], default=[4096, 32768])
    p.add_argument("--prefill-chunk", type=int, default=4096)
    p.add_argument("--unfused", action="store_true", help="skip fusing q/k/v, gate/up and linear-attention projections")
    p.add_argument("--swiglu", action=argparse.BooleanOptionalAction, default=True,
                   help="the decode step's gate_up + SiLU-mul as one GEMV for the shapes in gemv.TUNED.swiglu; --no-swiglu: cuBLAS + silu_mul")
    p.add_argument("--folded-decode", action=argparse.BooleanOptionalAction, default=None,
                   help="decode steps of a foldable (dense) shape with every RMSNorm folded into the projection after it, "
                        "or (--no-folded-decode) none; default: the model's choice (models.transformer folded_decode_default)")
    p.add_argument("--fla", action=argparse.BooleanOptionalAction, default=True,
                   help="Gated DeltaNet prefill through flash-linear-attention when it imports (kernels/gdn/gdn_chunk.py); --no-fla: the torch reference")
    p.add_argument("--drafter-layers", type=int, default=5, help="time a random DFlash drafter's pass with this many layers (0: skip)")
    p.add_argument("--block-size", type=int, default=16, help="the drafter's block size")
    p.add_argument("--hf", action="store_true", help="also time transformers' generate on the dense shape")
    p.add_argument("--hf-compile", action="store_true", help="also transformers' static cache, which it compiles (minutes)")
    p.add_argument("--hf-tokens", type=int, default=32)
    p.add_argument("--out", default="bench/results/gpu_speed.json")
    args = p.parse_args()
    tables = gemv_tables(args)
    args.gemv_tuned = {f"{n}x{k}": str(c) for (n, k), c in tables.linear.items()}
    args.gemv_swiglu_tuned = {f"{n}x{k}": str(c) for (n, k), c in tables.swiglu.items()}
    from treeflash.kernels.gdn import gdn_chunk
    args.fla_used = DEV == "cuda" and args.fla and gdn_chunk._fla_chunk() is not None
    print("Gated DeltaNet prefill:", "flash-linear-attention" if args.fla_used else "torch reference", flush=True)
    bw = measure_bandwidth(4.0 if DEV == "cuda" else 0.25)
    result = {"args": vars(args), "gpu": torch.cuda.get_device_name() if DEV == "cuda" else platform.processor() or "cpu", "torch": torch.__version__, "python": platform.python_version(),
              "copy_bandwidth_gb_s": bw / 1e9, "shapes": {}}
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    for shape in [s for s in args.shapes.split(",") + args.quant.split(",") if s]:
        r = bench_shape(shape, args, bw)
        result["shapes"][shape] = r
        d = r["decode"]
        print(f"{shape}: decode {d['tokens_per_s']:.1f} tok/s ({d['fraction_of_roofline']:.0%} of roofline; graph alone "
              f"{d['graph_fraction_of_roofline']:.0%}; pipelined {d['pipelined_tokens_per_s']:.1f} tok/s, "
              f"{d['pipelined_fraction_of_roofline']:.0%}), capture {r['capture_s']:.1f}s", flush=True)
        for kind in ("verify", "verify_tree"):
            for n, v in r[kind].items():
                print(f"  {kind:11s} {n:4d} nodes (depth {v['depth']:2d}): {v['step_ms']:.2f} ms ({v['ratio_to_decode_step']:.2f}x decode; "
                      f"graph {v['graph_ms']:.2f} ms)", flush=True)
        for n, v in r["prefill"].items():
            print(f"  prefill {n}: {v}", flush=True)
        for n, v in (r.get("drafter") or {}).get("passes", {}).items():
            print(f"  dflash pass, {n} new rows: eager {v['eager_ms']:.2f} ms, graph {v['graph_ms']:.2f} ms (replay {v['graph_replay_ms']:.2f} ms)", flush=True)
        if "transformers" in r:
            print(f"  transformers: {r['transformers']}", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
