"""Quality of compressed KV caches: next-token distributions against the dense cache over a long text.

    python bench/kv_quality.py --model PATH --out out/kv_quality.json [--text FILE] [--max-tokens 4096]

The text is fed in chunks (prefill of --chunk tokens at a time, so later tokens attend to a long
compressed prefix) once with the dense cache and once per K/V type pair, in lockstep. Per pair:
KL(dense || compressed) of the next-token distributions (mean, p99, max, and the mean over the
last quarter of the text, where the prefix is longest), perplexity of the text and its change,
and how often the top-1 token agrees with the dense cache's. Runs on a CPU (slowly) or a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from treeflash.models.step import StepInput  # noqa: E402

DEFAULT_PAIRS = ("q8_0/q8_0", "q8_0/q4_0", "q4_0/q4_0", "q8_0/tq3_0", "tq3_0/tq3_0")
# default text: Python standard library sources (always at hand, long, and not in any prompt set)
STDLIB_FILES = ("textwrap.py", "dataclasses.py", "argparse.py", "fractions.py", "heapq.py")


def default_text(max_chars: int) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_text(encoding="utf-8") for name in STDLIB_FILES if (root / name).exists()]
    return "\n\n".join(parts)[:max_chars]


@torch.inference_mode()
def measure(model, ids: torch.Tensor, pairs: list[str], chunk: int) -> dict:
    """ids: [N] long on the model's device. Returns {"dense": {...}, pair: {...}} metrics."""
    n = int(ids.shape[0])
    dense_type = "auto"
    caches = {"dense": model.new_cache(n, dense_type, dense_type)}
    for pair in pairs:
        kt, vt = pair.split("/")
        caches[pair] = model.new_cache(n, cache_type_k=kt, cache_type_v=vt)
    kl = {p: [] for p in pairs}
    nll = {p: [] for p in ["dense", *pairs]}
    agree = {p: 0 for p in pairs}
    for start in range(0, n, chunk):
        piece = ids[start : start + chunk]
        targets = ids[start + 1 : start + 1 + piece.shape[0]]  # the last position of the text has none
        logp = {}
        for name, cache in caches.items():
            logits = model(StepInput.plain(piece, start), cache).logits.float()
            logp[name] = torch.log_softmax(logits, dim=-1)
        ref = logp["dense"]
        for name, lp in logp.items():
            nll[name].append(-lp[: targets.shape[0]].gather(-1, targets[:, None]).squeeze(-1).cpu())
            if name != "dense":
                kl[name].append((ref.exp() * (ref - lp)).sum(-1).clamp_min(0).cpu())
                agree[name] += int((lp.argmax(-1) == ref.argmax(-1)).sum())
    out = {}
    ppl_dense = math.exp(torch.cat(nll["dense"]).mean().item())
    out["dense"] = {"perplexity": ppl_dense}
    for p in pairs:
        k = torch.cat(kl[p])
        ppl = math.exp(torch.cat(nll[p]).mean().item())
        out[p] = {
            "kl_mean": k.mean().item(),
            "kl_p99": k.quantile(0.99).item(),
            "kl_max": k.max().item(),
            "kl_mean_last_quarter": k[3 * n // 4 :].mean().item(),
            "perplexity": ppl,
            "perplexity_delta": ppl - ppl_dense,
            "perplexity_delta_rel": ppl / ppl_dense - 1,
            "top1_agreement": agree[p] / n,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory or .gguf file")
    ap.add_argument("--out", required=True, help="path of the JSON artifact")
    ap.add_argument("--text", help="a UTF-8 text file (default: Python standard library sources)")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=512, help="tokens per prefill chunk")
    ap.add_argument("--pairs", nargs="+", default=list(DEFAULT_PAIRS), help="K/V type pairs, e.g. q8_0/tq3_0")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    from treeflash.models.loader import load_model  # written beside this script; imported only when run

    t0 = time.time()
    loaded = load_model(args.model, device=args.device)
    model = loaded.model
    text = Path(args.text).read_text(encoding="utf-8") if args.text else default_text(args.max_tokens * 8)
    ids = list(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])[: args.max_tokens]
    metrics = measure(model, torch.tensor(ids, device=model.device), args.pairs, args.chunk)
    report = {
        "bench": "kv_quality",
        "model": str(args.model),
        "device": str(model.device),
        "dtype": str(model.dtype),
        "num_tokens": len(ids),
        "chunk": args.chunk,
        "text": args.text or f"python stdlib: {', '.join(STDLIB_FILES)}",
        "metrics": metrics,
        "wall_s": time.time() - t0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    for name, m in metrics.items():
        extra = "" if name == "dense" else f"  KL mean {m['kl_mean']:.2e} p99 {m['kl_p99']:.2e}  top1 {m['top1_agreement']:.3f}"
        print(f"{name:<12} ppl {m['perplexity']:.3f}{extra}")
    print(f"wrote {args.out} ({len(ids)} tokens, {report['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
