"""Flags shared by generate, serve and bench, and the engine they describe."""

from __future__ import annotations

import argparse
import sys

from treeflash.errors import InvalidRequestError
from treeflash.cli.planning import parse_budget  # noqa: F401  (bench and build_engine use it from here)


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None, help="Hugging Face directory, .gguf file, or Hub id org/name[:file.gguf][@revision] (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to run (default: cuda if present)")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="runtime dtype (default: float32 on CPU, bfloat16 on CUDA)")
    g.add_argument("--weights", default="auto", choices=["auto", "float", "native", "int4"],
                   help="auto (default): float, unless a GGUF on CUDA fits only with its blocks kept (then native); float: dequantize a GGUF to --dtype; native: keep each GGUF matrix in its stored blocks where a "
                        "fast path runs its type (CUDA: the quantized kernels; CPU: int4 for Q4_0/Q4_1), dequantize the rest "
                        "(docs/quant.md has the table); int4: the CPU int4 path alone (~2x faster decode, bf16-level precision)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch (default: PyTorch's choice; serve on a CPU: 1; 1 is faster on a busy machine)")
    g.add_argument("--max-context", type=context_arg, default=8192,
                   help="tokens of KV cache to allocate, or auto: the most that fits (default 8192; checked against the memory plan)")
    g.add_argument("--gpu-memory", default="auto",
                   help="memory to plan within: auto (free GPU memory; the CPU: available RAM), 24GiB, 24GB, 24000MiB or a card (rtx4090)")
    g.add_argument("--prefill-chunk", type=prefill_chunk_arg, default="auto",
                   help="tokens per prefill chunk: auto (2048, or the largest of 1024/512/256 that fits the memory plan) or an integer")
    g.add_argument("--cache-type-k", default="auto", help="K cache type: auto, bf16, f16, f32, q8_0, q4_0, tq3_0")
    g.add_argument("--cache-type-v", default="auto", help="V cache type: auto, bf16, f16, f32, q8_0, q4_0, tq3_0")
    g.add_argument("--cache-k-exact-layers", type=non_negative_int, default=0, metavar="N",
                   help="keep K uncompressed in the first N attention layers (1 rescues q4_0/tq3_0 keys on Qwen2.5; docs/kv.md)")
    d = p.add_argument_group("speculative decoding")
    d.add_argument("--draft", default=None, help="drafter: ngram, draft, mtp, dflash, or replay (an oracle for benchmarks: the target's own recorded output) (default: none, plain decoding)")
    d.add_argument("--draft-model", default=None, help="drafter weights for --draft draft / dflash (dflash on the embedded default: its shipped drafter)")
    d.add_argument("--num-draft", type=int, default=5, help="tokens per chain draft for ngram/draft/mtp (default 5)")
    d.add_argument("--drafter-weights", default="float", choices=["float", "q8_0"],
                   help="dflash: the drafter's linear layers at the runtime dtype (float, default) or as Q8_0 blocks quantized at load (about half the bytes)")
    d.add_argument("--budget", default="auto", help="DDTree node budget for dflash: an integer or 'auto' (default)")
    d.add_argument("--auto-arms", default=None, metavar="B0,B1,...",
                   help="dflash --budget auto: the budgets its bandit chooses among, 0 = a plain step (default 0,4,8,16,32,48,64)")
    d.add_argument("--no-tree", action="store_true", help="dflash: verify the plain DFlash chain instead of a DDTree")
    d.add_argument("--mtp-tree", action="store_true",
                   help="mtp: draft a DDTree from the MTP head's per-depth top-k (--budget nodes; auto: 3 per --num-draft depth) instead of a chain")
    d.add_argument("--replay-corrupt", type=float, default=0.0, metavar="P",
                   help="--draft replay (oracle): replace each replayed draft token with probability P (default 0: tau = num-draft + 1)")


def prefill_chunk_arg(value: str) -> int | str:
    from treeflash.cli.planning import parse_prefill_chunk

    return parse_prefill_chunk(value)


def non_negative_int(value: str) -> int:
    """argparse type: an integer >= 0 (argparse names the flag in its error)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {n}")
    return n


def context_arg(value: str) -> int | str:
    """argparse type of --max-context: an integer >= 1 or 'auto'."""
    from treeflash.cli.planning import parse_context

    try:
        return parse_context(value)
    except InvalidRequestError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_bandit(value: str | None):
    """--auto-arms '0,8,32' -> the BanditConfig of --budget auto (the defaults when None)."""
    from treeflash.spec.bandit import BanditConfig

    if value is None:
        return BanditConfig()
    try:
        arms = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise InvalidRequestError(f"--auto-arms must be comma-separated integers, got {value!r}", "auto_arms") from None
    try:
        return BanditConfig(arms=arms)
    except InvalidRequestError as e:
        raise InvalidRequestError(f"--auto-arms: {e}", "auto_arms") from None


def build_engine(args: argparse.Namespace, progress: bool = True):
    import torch

    from treeflash.engine.engine import Engine, EngineConfig
    from treeflash.engine.prefix_cache import PrefixCacheConfig
    from treeflash.models.loader import load_model
    from treeflash.spec.drafter import DraftOptions

    if getattr(args, "threads", None):
        if args.threads < 1:
            raise InvalidRequestError(f"--threads must be >= 1, got {args.threads}", "threads")
        torch.set_num_threads(args.threads)
    from treeflash.cli.planning import plan_at_start
    from treeflash.models.memory.plan import graph_buckets

    start = getattr(args, "start_plan", None) or plan_at_start(args)  # refuses before any weight is read
    if progress:
        print(f"[treeflash] {start.summary}", file=sys.stderr)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    from treeflash.models.loader import resolve_device

    if resolve_device(args.device).type == "cuda":
        from treeflash.models.memory.allocator import use_expandable_segments

        use_expandable_segments()  # the allocator's reserve then follows the planned peak (allocator.py)
    loaded = load_model(args.model, device=args.device, dtype=dtype, progress=progress, weights=start.weights,
                        mtp=args.draft == "mtp")  # the MTP head is read only for its drafter (the planner counts the same)
    options = DraftOptions(
        num_draft=args.num_draft,
        draft_model=args.draft_model,
        budget=parse_budget(args.budget),
        tree=not args.no_tree,
        mtp_tree=getattr(args, "mtp_tree", False),
        drafter_weights=getattr(args, "drafter_weights", "float"),
        replay_corrupt=getattr(args, "replay_corrupt", 0.0),
        bandit=parse_bandit(getattr(args, "auto_arms", None)),
    )
    config = EngineConfig(
        max_context=start.max_context,
        graph_buckets=graph_buckets(start.verify_nodes),
        memory_plan=start.plan,
        draft=args.draft,
        draft_options=options,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
        cache_k_exact_layers=args.cache_k_exact_layers,
        # the prefill chunk the plan was made for (smaller than the default where that does not fit)
        prefix_cache=PrefixCacheConfig(max_mb=getattr(args, "prefix_cache_mb", 0.0), chunk=start.prefill_chunk),  # a serve flag
    )
    return Engine(loaded, config)
