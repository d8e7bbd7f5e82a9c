"""Flags shared by generate, serve and bench, and the engine they describe."""

from __future__ import annotations

import argparse

from treeflash.errors import InvalidRequestError


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None, help="Hugging Face directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to run (default: cuda if present)")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="runtime dtype (default: float32 on CPU, bfloat16 on CUDA)")
    g.add_argument("--weights", default="float", choices=["float", "native", "int4"],
                   help="float: dequantize a GGUF to --dtype (default); native: keep each GGUF matrix in its stored blocks where a "
                        "fast path runs its type (CUDA: the quantized kernels; CPU: int4 for Q4_0/Q4_1), dequantize the rest "
                        "(docs/quant.md has the table); int4: the CPU int4 path alone (~2x faster decode, bf16-level precision)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch (default: PyTorch's choice; serve on a CPU: 1; 1 is faster on a busy machine)")
    g.add_argument("--max-context", type=int, default=8192, help="tokens of KV cache to allocate (default 8192)")
    g.add_argument("--cache-type-k", default="auto", help="K cache type: auto, bf16, f16, f32, q8_0, q4_0, tq3_0")
    g.add_argument("--cache-type-v", default="auto", help="V cache type: auto, bf16, f16, f32, q8_0, q4_0, tq3_0")
    g.add_argument("--cache-k-exact-layers", type=non_negative_int, default=0, metavar="N",
                   help="keep K uncompressed in the first N attention layers (1 rescues q4_0/tq3_0 keys on Qwen2.5; docs/kv.md)")
    d = p.add_argument_group("speculative decoding")
    d.add_argument("--draft", default=None, help="drafter: ngram, draft, mtp, dflash (default: none, plain decoding)")
    d.add_argument("--draft-model", default=None, help="drafter weights for --draft draft / dflash (dflash on the embedded default: its shipped drafter)")
    d.add_argument("--num-draft", type=int, default=5, help="tokens per chain draft for ngram/draft/mtp (default 5)")
    d.add_argument("--budget", default="auto", help="DDTree node budget for dflash: an integer or 'auto' (default)")
    d.add_argument("--no-tree", action="store_true", help="dflash: verify the plain DFlash chain instead of a DDTree")


def non_negative_int(value: str) -> int:
    """argparse type: an integer >= 0 (argparse names the flag in its error)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {n}")
    return n


def parse_budget(value: str) -> int | str:
    if value == "auto":
        return "auto"
    try:
        return int(value)
    except ValueError:
        raise InvalidRequestError(f"--budget must be an integer or 'auto', got {value!r}", "budget") from None


def build_engine(args: argparse.Namespace, progress: bool = True):
    import torch

    from treeflash.engine.engine import Engine, EngineConfig
    from treeflash.models.loader import load_model
    from treeflash.spec.drafter import DraftOptions

    if getattr(args, "threads", None):
        if args.threads < 1:
            raise InvalidRequestError(f"--threads must be >= 1, got {args.threads}", "threads")
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    loaded = load_model(args.model, device=args.device, dtype=dtype, progress=progress, weights=getattr(args, "weights", "float"))
    options = DraftOptions(
        num_draft=args.num_draft,
        draft_model=args.draft_model,
        budget=parse_budget(args.budget),
        tree=not args.no_tree,
    )
    config = EngineConfig(
        max_context=args.max_context,
        draft=args.draft,
        draft_options=options,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
        cache_k_exact_layers=args.cache_k_exact_layers,
    )
    return Engine(loaded, config)
