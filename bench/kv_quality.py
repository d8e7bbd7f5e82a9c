"""Quality of compressed KV caches: next-token distributions against the uncompressed cache over a long text.

    python -m bench.kv_quality --model default --out bench/results/kv_quality_smollm2.json \\
        --max-tokens 7400 --eval-last 512 --needle-depth 0.15

The text (default: Python standard library sources, PSF-licensed) is cut to --max-tokens tokens;
a needle line ("# The secret passphrase is <word>-<number>.") is put at a line break at
--needle-depth of it, and a question about the needle follows the text. The whole prompt is fed
as a chunked prefill (--chunk tokens at a time, so later tokens attend to a long compressed
prefix) once with the reference cache (--reference, default "auto" = the runtime dtype, fp32 on
a CPU: uncompressed) and once per K/V type pair (default: all 16 pairs of bf16, q8_0, q4_0,
tq3_0, plus tq3_0 with its Hadamard rotation replaced by the identity). Per pair, over the last
--eval-last positions of the text (teacher-forced, the context before them is the whole text):
KL(reference || pair) of the next-token distributions (mean, median, p99, max), perplexity and
its change, top-1 agreement with the reference; then greedy decoding after the question, and
whether it returns the passphrase. One pair's prefill at a time; the reference's log-probs are
computed once. The JSON is rewritten after every pair.

The bench-only variants ("tq3_0-norot", "<type>-sinkN", "<type>-exactlayersN", "<type>-q8layersN")
are described in bench/kv_quality_variants.py. The JSON also records, per pair and layer, the mean
attention mass on positions 0, < 4, < 16, < 64 of the queries at positions >= --chunk (heads and
queries averaged; see attention_mass()).

--attention fast (the default) replaces the plain-torch SDPA call of the CPU reference path
(kv.attention_cache.attention_reference, used by the dense and the compressed caches alike) with
`fast_attention`: the same fp32 math (scores by bmm, masked softmax, bmm) without SDPA's CPU
math-path overhead and GQA expansion; it agrees with SDPA to ~1e-7 (tests/kv/test_kv_quality_bench.py)
and is faster on this CPU (1.2x on one 512 x 4096 attention; SDPA takes its math path with a
boolean mask). What is stored and read (quantize on write, dequantize on
read) is the cache's own code either way. --attention sdpa keeps the runtime's call.

--row-errors N also reports each format's relative error on the model's own K and V rows (all
layers, from a dense prefill of the first N tokens), against the whole row and against its
token-varying part. --resume keeps the pairs already in --out (the reference is recomputed and
must reproduce) and runs the others. The perplexity change comes with its standard error over
the scored positions (paired per-token NLL differences): 512 positions resolve about 0.1%.

    python -m bench.kv_quality --table bench/results/kv_quality_smollm2.json   # markdown tables
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import random
import sys
import sysconfig
import time
from pathlib import Path


import torch
from torch.nn.attention.bias import CausalBias

from bench.kv_quality_variants import NOROT, _no_rotation, _split_pair, variant  # noqa: F401 (tests use the helpers)
from treeflash.kernels.kv import kv_formats as formats
from treeflash.models.step import StepInput

GRID_TYPES = ("bf16", "q8_0", "q4_0", "tq3_0")
GRID = tuple(f"{k}/{v}" for k in GRID_TYPES for v in GRID_TYPES)  # 16 K/V pairs
DEFAULT_PAIRS = (*GRID, f"{NOROT}/{NOROT}")
# default text: Python standard library sources (always at hand, long, and not in any prompt set)
STDLIB_FILES = ("textwrap.py", "dataclasses.py", "argparse.py", "fractions.py", "heapq.py")
NEEDLE_WORDS = ("marigold", "tangerine", "obsidian", "lantern", "juniper", "cobalt", "saffron", "walrus")
QUESTION = (
    "\n\n# Question: what is the secret passphrase written in a comment in the code above?\n"
    "# Answer: The secret passphrase is"
)


def default_text(max_chars: int) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_text(encoding="utf-8") for name in STDLIB_FILES if (root / name).exists()]
    return "\n\n".join(parts)[:max_chars]


def fast_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Drop-in for attention_reference: q [T, H, D], keys/values [S, Hkv, D], mask [T, S] bool, None or a
    lower-right causal bias (a prefill chunk: query i sees keys up to S - T + i) -> [T, H, D]."""
    t, h, d = q.shape
    s, hkv = keys.shape[0], keys.shape[1]
    if isinstance(mask, CausalBias):
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    g = h // hkv
    qg = (q * scale).reshape(t, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * t, d)  # [Hkv, G*T, D]
    scores = torch.bmm(qg, keys.permute(1, 2, 0))  # [Hkv, G*T, S]
    if mask is not None:
        scores.view(hkv, g, t, s).masked_fill_(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if _MASS is not None and t > 1 and s - t >= _MASS["min_start"]:  # prefill chunks past the first
        _MASS["calls"].append((torch.stack([probs[..., :e].sum() for e in MASS_EDGES]), probs.shape[0] * probs.shape[1]))
    out = torch.bmm(probs, values.permute(1, 0, 2))  # [Hkv, G*T, D]
    return out.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, h, d)


MASS_EDGES = (1, 4, 16, 64)  # attention mass on positions < e
_MASS: dict | None = None  # set by attention_mass(): {"min_start", "calls": [tensor per attention call]}


@contextlib.contextmanager
def attention_mass(min_start: int, num_layers: int, into: dict):
    """While active, fast_attention records the mean attention probability mass (over KV heads, query
    heads and queries) on positions < e for e in MASS_EDGES, for prefill chunks whose first query is
    at position >= min_start; on exit `into` gets {"pos_lt_<e>": [per layer], "mean_pos_lt_<e>": ...}.
    Calls are assigned to layers in order (one call per attention layer per chunk)."""
    global _MASS
    _MASS = {"min_start": min_start, "calls": []}
    try:
        yield
    finally:
        calls, _MASS = _MASS["calls"], None
        if calls and len(calls) % num_layers == 0:
            sums = torch.stack([c[0] for c in calls]).view(-1, num_layers, len(MASS_EDGES)).sum(0)  # [L, E]
            rows = torch.tensor([float(c[1]) for c in calls]).view(-1, num_layers).sum(0)  # [L] (head, query) rows
            per_layer = sums / rows[:, None]
            for j, e in enumerate(MASS_EDGES):
                into[f"pos_lt_{e}"] = [round(x, 4) for x in per_layer[:, j].tolist()]
                into[f"mean_pos_lt_{e}"] = per_layer[:, j].mean().item()


def use_fast_attention() -> None:
    """Route the CPU reference path of the dense and compressed caches through fast_attention."""
    from treeflash.kv import attention_cache, quantized

    attention_cache.attention_reference = quantized.attention_reference = fast_attention


CENTER_KEYS = True  # compressed K stored minus the prompt's mean key (the cache's default); --no-center-keys: raw keys
ROTATE_KEYS = True  # q8_0 / q4_0 K stored rotated (the cache's default); --no-rotate-keys: as they are
K_EXACT_LAYERS = 0  # --k-exact-layers: the runtime option (CacheSpec.k_exact_layers), for every pair


@torch.inference_mode()
def prefill(model, ids: torch.Tensor, kt: str, vt: str, chunk: int, eval_pos: torch.Tensor, extra: int = 0):
    """Chunked prefill of ids [N] with a (kt, vt) cache of N + extra slots.

    Returns (log-probs [len(eval_pos), V] fp32 at the positions eval_pos (sorted), cache)."""
    n = int(ids.shape[0])
    cache = model.new_cache(n + extra, cache_type_k=kt, cache_type_v=vt, center_keys=CENTER_KEYS, k_exact_layers=K_EXACT_LAYERS,
                            rotate_keys=ROTATE_KEYS)
    out = []
    for start in range(0, n, chunk):
        piece = ids[start : start + chunk]
        end = start + piece.shape[0]
        at = eval_pos[(eval_pos >= start) & (eval_pos < end)] - start
        if at.numel() == 0:
            model(StepInput.plain(piece, start), cache, compute_logits=False)
            continue
        logits = model(StepInput.plain(piece, start), cache, logits_at=at.to(ids.device)).logits
        out.append(torch.log_softmax(logits.float(), dim=-1).cpu())
    return (torch.cat(out) if out else None), cache


@torch.inference_mode()
def greedy(model, cache, first_logp: torch.Tensor, start: int, steps: int, device) -> list[int]:
    """Greedy continuation from a filled cache: first token = argmax(first_logp)."""
    toks = [int(first_logp.argmax())]
    for i in range(steps - 1):
        logits = model(StepInput.plain(torch.tensor([toks[-1]], device=device), start + i), cache).logits
        toks.append(int(logits[-1].argmax()))
    return toks


@torch.inference_mode()
def row_errors(model, ids: torch.Tensor, chunk: int) -> dict:
    """Relative error ||dequant(quant(x)) - x|| / ||x|| of the model's own K and V rows (post-rotary
    keys, all layers and KV heads, captured from a dense prefill of ids) for each cache format:
    {"k"|"v": {format: {"rel_rms", "rel_p50", "rel_p99"}}}."""
    from treeflash.kv import attention_cache

    rows: dict[str, dict[int, list[torch.Tensor]]] = {"k": {}, "v": {}}  # per layer cache object
    attend = attention_cache.DenseAttentionCache.attend

    def capture(self, q, k, v, *rest):
        rows["k"].setdefault(id(self), []).append(k.float().cpu())
        rows["v"].setdefault(id(self), []).append(v.float().cpu())
        return attend(self, q, k, v, *rest)

    attention_cache.DenseAttentionCache.attend = capture
    try:
        prefill(model, ids, "f32", "f32", chunk, torch.empty(0, dtype=torch.long, device=ids.device))
    finally:
        attention_cache.DenseAttentionCache.attend = attend
    out: dict = {}
    for name, layers in rows.items():
        per_layer = [torch.cat(parts) for parts in layers.values()]  # [tokens, Hkv, D] each
        x = torch.cat([t.flatten(0, 1) for t in per_layer])  # [rows, D]
        # the part of each row that varies over tokens (row minus its layer/head's mean row): the
        # mean adds the same amount to every score of a query only without rotary; still a yardstick
        varying = torch.cat([(t - t.mean(0, keepdim=True)).flatten(0, 1) for t in per_layer]).norm(dim=-1).clamp_min(1e-12)
        mean = torch.cat([t.mean(0, keepdim=True).expand_as(t).flatten(0, 1) for t in per_layer])  # [rows, D]
        out[name] = {}
        for fmt in ("bf16", "q8_0", "q4_0", "tq3_0", NOROT):
            with _no_rotation() if fmt == NOROT else contextlib.nullcontext():
                f = fmt.replace(NOROT, "tq3_0")
                y = formats.dequantize(f, *formats.quantize(f, x)) if f != "bf16" else x.bfloat16().float()
            e = (y - x).norm(dim=-1)
            err = e / x.norm(dim=-1).clamp_min(1e-12)
            out[name][fmt] = {
                "rel_rms": err.square().mean().sqrt().item(),
                "rel_p50": err.median().item(),
                "rel_p99": err[: 1 << 24].quantile(0.99).item(),
                "rel_rms_to_varying_part": (e / varying).square().mean().sqrt().item(),
            }
            if f != "bf16":  # what-if: quantize the row minus its layer/head's mean row (not a cache format)
                with _no_rotation() if fmt == NOROT else contextlib.nullcontext():
                    yc = formats.dequantize(f, *formats.quantize(f, x - mean)) + mean
                out[name][fmt]["centered_rel_rms_to_varying_part"] = ((yc - x).norm(dim=-1) / varying).square().mean().sqrt().item()
        # outliers: mean over rows of max |x_i| / rms(x), before and after the tq3_0 rotation
        rms = x.square().mean(-1).sqrt().clamp_min(1e-12)
        out[name]["peak_to_rms"] = (x.abs().amax(-1) / rms).mean().item()
        out[name]["peak_to_rms_rotated"] = (formats.rotate(x).abs().amax(-1) / rms).mean().item()
        out[name]["varying_to_total_norm"] = (varying.square().sum() / x.square().sum()).sqrt().item()
        out[name]["rows"] = int(x.shape[0])
    return out


def compare(ref: torch.Tensor, lp: torch.Tensor, targets: torch.Tensor) -> dict:
    """ref, lp: [W, V] log-probs at the same positions; targets: [W] next tokens."""
    kl = (ref.exp() * (ref - lp)).sum(-1).clamp_min(0)
    nll_ref = -ref.gather(-1, targets[:, None]).squeeze(-1)
    nll = -lp.gather(-1, targets[:, None]).squeeze(-1)
    ppl_ref, ppl = math.exp(nll_ref.mean().item()), math.exp(nll.mean().item())
    return {
        "kl_mean": kl.mean().item(),
        "kl_median": kl.median().item(),
        "kl_p99": kl.quantile(0.99).item(),
        "kl_max": kl.max().item(),
        "perplexity": ppl,
        "perplexity_delta": ppl - ppl_ref,
        "perplexity_delta_rel": ppl / ppl_ref - 1,
        # standard error of the mean per-token NLL change (paired): ~ the standard error of
        # perplexity_delta_rel, i.e. how much of the change 512 positions can resolve
        "perplexity_delta_rel_se": ((nll - nll_ref).std() / math.sqrt(nll.numel())).item() if nll.numel() > 1 else 0.0,
        "top1_agreement": (lp.argmax(-1) == ref.argmax(-1)).float().mean().item(),
        "nll": [round(x, 5) for x in nll.tolist()],  # per position, for any other statistic
    }


def measure(model, ids: torch.Tensor, pairs: list[str], chunk: int, eval_last: int | None = None, reference: str = "auto") -> dict:
    """ids: [N] long on the model's device. Teacher-forced metrics of each pair against the reference
    cache over the last eval_last positions that have a next token (None: all of them).
    Returns {"dense": {"perplexity"}, pair: {...}}."""
    n = int(ids.shape[0])
    w = n - 1 if eval_last is None else min(eval_last, n - 1)
    pos = torch.arange(n - 1 - w, n - 1)
    targets = ids[pos + 1].cpu()
    ref, _ = prefill(model, ids, reference, reference, chunk, pos.to(ids.device))
    out = {"dense": {"perplexity": math.exp(-ref.gather(-1, targets[:, None]).mean().item())}}
    for pair in pairs:
        with variant(pair) as (kt, vt):
            lp, _ = prefill(model, ids, kt, vt, chunk, pos.to(ids.device))
        out[pair] = compare(ref, lp, targets)
    return out


def build_prompt(tokenizer, text: str, max_tokens: int, depth: float | None, seed: int = 0):
    """-> (ids, info): text cut to max_tokens tokens, a needle line at `depth` (None: no needle),
    then the question. info: text_tokens, needle_token, passphrase, question_tokens."""
    enc = lambda s: list(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    body = tokenizer.decode(enc(text)[:max_tokens])
    info: dict = {}
    if depth is not None:
        rng = random.Random(seed)
        passphrase = f"{rng.choice(NEEDLE_WORDS)}-{rng.randint(1000, 9999)}"
        cut = body.find("\n", int(depth * len(body)))
        cut = len(body) if cut < 0 else cut + 1
        needle = f"# The secret passphrase is {passphrase}. Remember it.\n"
        before = enc(body[:cut])
        text_ids = before + enc(needle + body[cut:])
        info.update(passphrase=passphrase, needle_token=len(before), needle_line=needle.strip())
        question = enc(QUESTION)
    else:
        text_ids, question = enc(body), []
    info.update(text_tokens=len(text_ids), question_tokens=len(question))
    return text_ids + question, info


def render_markdown(report: dict) -> str:
    m = report["metrics"]
    ref = m["reference"]
    lines = [
        f"{report['model_name']}: {report['num_tokens']} tokens (text {report['prompt']['text_tokens']}), "
        f"eval over the last {report['eval_positions']} text positions; reference cache {report['reference']} "
        f"perplexity {ref['perplexity']:.4f}"
        + (f", needle at token {report['prompt']['needle_token']} ({report['prompt']['needle_token'] / report['prompt']['text_tokens']:.0%} depth), reference retrieval: {'yes' if ref['needle']['found'] else 'NO'}" if "needle" in ref else ""),
        "",
        "| K / V | KL mean | KL median | KL p99 | KL max | top-1 agree | PPL | dPPL | dPPL % (± s.e.) | needle |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, r in m.items():
        if pair == "reference":
            continue
        said = r["needle"]["output"].strip()[:24].replace("\n", "\\n").replace("|", "\\|").replace("`", "'") if "needle" in r else ""
        needle = ("yes" if r["needle"]["found"] else f"no (`{said}`)") if "needle" in r else ""
        se = f" ± {100 * r['perplexity_delta_rel_se']:.3f}" if "perplexity_delta_rel_se" in r else ""
        lines.append(
            f"| {pair} | {r['kl_mean']:.2e} | {r['kl_median']:.2e} | {r['kl_p99']:.2e} | {r['kl_max']:.2e} | "
            f"{r['top1_agreement']:.3f} | {r['perplexity']:.4f} | {r['perplexity_delta']:+.4f} | "
            f"{100 * r['perplexity_delta_rel']:+.3f}{se} | {needle} |"
        )
    return "\n".join(lines)


def render_grid(report: dict) -> str:
    """4 x 4 matrices (K type by row, V type by column) of KL mean, dPPL % and needle retrieval."""
    m = report["metrics"]
    out = []
    for title, cell in (
        ("KL mean", lambda r: f"{r['kl_mean']:.1e}"),
        ("PPL change %", lambda r: f"{100 * r['perplexity_delta_rel']:+.2f}"),
        ("needle retrieved", lambda r: "yes" if r.get("needle", {}).get("found") else "no" if "needle" in r else ""),
    ):
        out += [f"{title} (rows: K type, columns: V type)", "", "| K \\ V | " + " | ".join(GRID_TYPES) + " |", "|---" * (len(GRID_TYPES) + 1) + "|"]
        for kt in GRID_TYPES:
            out.append(f"| **{kt}** | " + " | ".join(cell(m[f"{kt}/{vt}"]) if f"{kt}/{vt}" in m else "" for vt in GRID_TYPES) + " |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="Hugging Face model directory or .gguf file; 'default' = SmolLM2-135M-Instruct")
    ap.add_argument("--out", help="path of the JSON artifact")
    ap.add_argument("--table", help="print the markdown tables of an existing JSON artifact and exit")
    ap.add_argument("--text", help="a UTF-8 text file (default: Python standard library sources)")
    ap.add_argument("--max-tokens", type=int, default=4096, help="tokens of text (the question comes after)")
    ap.add_argument("--eval-last", type=int, default=512, help="positions scored at the end of the text (0: all)")
    ap.add_argument("--needle-depth", type=float, default=0.15, help="needle position as a fraction of the text; < 0: none")
    ap.add_argument("--needle-seed", type=int, default=0)
    ap.add_argument("--decode-tokens", type=int, default=12, help="greedy tokens after the question")
    ap.add_argument("--chunk", type=int, default=512, help="tokens per prefill chunk")
    ap.add_argument("--pairs", nargs="*", default=list(DEFAULT_PAIRS), help=f"K/V type pairs, e.g. q8_0/tq3_0, {NOROT}/{NOROT} or tq3_0-sink4/bf16")
    ap.add_argument("--reference", default="auto", help="reference cache type for K and V (auto = runtime dtype)")
    ap.add_argument("--row-errors", type=int, default=0, metavar="N",
                    help="also: relative error of each format on the model's own K/V rows from the first N tokens")
    ap.add_argument("--attention", choices=("fast", "sdpa"), default="fast", help="CPU attention of the reference path (see above)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the pairs already in --out (same prompt; the reference is recomputed and must match) and run the others")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k-exact-layers", type=int, default=0, metavar="N",
                    help="every pair through caches whose first N attention layers keep K uncompressed (the runtime's --cache-k-exact-layers)")
    ap.add_argument("--no-center-keys", action="store_true",
                    help="store compressed keys as they are, not minus the prompt's mean key (the ablation)")
    ap.add_argument("--no-rotate-keys", action="store_true",
                    help="store q8_0 / q4_0 keys unrotated (CacheSpec.rotate_keys off: the ablation)")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    if args.table:
        report = json.loads(Path(args.table).read_text())
        print(render_markdown(report) + "\n\n" + render_grid(report))
        return
    if not (args.model and args.out):
        ap.error("--model and --out are required")
    from treeflash.models.loader import load_model  # written beside this script; imported only when run

    torch.set_num_threads(args.threads)
    global CENTER_KEYS, K_EXACT_LAYERS, ROTATE_KEYS
    CENTER_KEYS = not args.no_center_keys
    ROTATE_KEYS = not args.no_rotate_keys
    K_EXACT_LAYERS = args.k_exact_layers
    if args.attention == "fast":
        use_fast_attention()
    t0 = time.time()
    loaded = load_model(None if args.model == "default" else args.model, device=args.device, progress=False)
    model = loaded.model
    text = Path(args.text).read_text(encoding="utf-8") if args.text else default_text(args.max_tokens * 8)
    depth = None if args.needle_depth < 0 else args.needle_depth
    ids_list, info = build_prompt(loaded.tokenizer, text, args.max_tokens, depth, args.needle_seed)
    ids = torch.tensor(ids_list, device=model.device)
    n_text = info["text_tokens"]
    w = n_text - 1 if args.eval_last <= 0 else min(args.eval_last, n_text - 1)
    pos = torch.arange(n_text - 1 - w, n_text - 1)  # positions whose next token is text
    targets = ids[pos + 1].cpu()
    if depth is not None:
        pos = torch.cat((pos, torch.tensor([len(ids_list) - 1])))  # + the answer position
    report = {
        "bench": "kv_quality",
        "model": str(args.model),
        "model_name": Path(loaded.source).name if loaded.source else str(args.model),
        "config": {k: getattr(loaded.config, k, None) for k in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size")},
        "device": str(model.device),
        "dtype": str(model.dtype),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "reference": args.reference,
        "attention": args.attention,
        "center_keys": CENTER_KEYS,
        "rotate_keys": ROTATE_KEYS,
        "k_exact_layers": K_EXACT_LAYERS,
        "num_tokens": len(ids_list),
        "eval_positions": w,
        "chunk": args.chunk,
        "text": args.text or f"python {platform.python_version()} stdlib: {', '.join(STDLIB_FILES)} (concatenated, cut)",
        "prompt": info,
        "question": QUESTION if depth is not None else None,
        "command": " ".join(sys.argv),
        "metrics": {},
    }

    def run(kt: str, vt: str) -> tuple[torch.Tensor, dict]:
        t = time.time()
        res: dict = {}
        mass: dict = {}
        with attention_mass(args.chunk, loaded.config.num_layers, mass) if args.attention == "fast" else contextlib.nullcontext():
            lp, cache = prefill(model, ids, kt, vt, args.chunk, pos.to(ids.device), extra=args.decode_tokens)
        if mass:
            res["attention_mass"] = mass
        if depth is not None:
            toks = greedy(model, cache, lp[-1], len(ids_list), args.decode_tokens, model.device)
            output = loaded.tokenizer.decode(toks)
            answer = list(loaded.tokenizer(" " + info["passphrase"], add_special_tokens=False)["input_ids"])
            res["needle"] = {
                "output": output,
                "found": info["passphrase"] in output,
                "answer_first_token_logprob": lp[-1, answer[0]].item(),
            }
            lp = lp[:-1]
        res["wall_s"] = time.time() - t
        return lp, res

    def save() -> None:
        report["wall_s"] = time.time() - t0
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))

    old = json.loads(Path(args.out).read_text()) if args.resume and Path(args.out).exists() else None
    if old is not None and (old["prompt"] != info or old["num_tokens"] != len(ids_list) or old["eval_positions"] != w):
        raise SystemExit(f"--resume: {args.out} was made with another prompt or window")
    if args.row_errors:
        report["row_errors"] = {"tokens": min(args.row_errors, len(ids_list)), **row_errors(model, ids[: args.row_errors], args.chunk)}
        if old is None:  # (resuming: the kept pairs are written back with the reference)
            save()
        for name in ("k", "v"):
            r = report["row_errors"][name]
            print(name, "rel. RMS error:", {f: round(r[f]["rel_rms"], 4) for f in ("bf16", "q8_0", "q4_0", "tq3_0", NOROT)},
                  "of the varying part:", {f: round(r[f]["rel_rms_to_varying_part"], 4) for f in ("q8_0", "q4_0", "tq3_0", NOROT)},
                  "centered:", {f: round(r[f]["centered_rel_rms_to_varying_part"], 4) for f in ("q8_0", "q4_0", "tq3_0", NOROT)},
                  f"peak/rms {r['peak_to_rms']:.1f} -> {r['peak_to_rms_rotated']:.1f} rotated, varying/total {r['varying_to_total_norm']:.2f}", flush=True)
        if not args.pairs:
            return
    ref, res = run(args.reference, args.reference)
    nll_ref = -ref.gather(-1, targets[:, None]).squeeze(-1)
    res["perplexity"] = math.exp(nll_ref.mean().item())
    res["nll"] = [round(x, 5) for x in nll_ref.tolist()]
    report["metrics"]["reference"] = res
    if old is not None:
        same = abs(old["metrics"]["reference"]["perplexity"] / res["perplexity"] - 1) < 1e-6
        print(f"--resume: reference perplexity {res['perplexity']:.6f}, was {old['metrics']['reference']['perplexity']:.6f}", flush=True)
        if not same:
            raise SystemExit("--resume: the reference does not reproduce; run without --resume")
        report["resumed"] = {"kept_pairs": [p for p in old["metrics"] if p != "reference"], "from_command": old.get("command"),
                             "wall_s_before": old.get("wall_s")}
        if "row_errors" not in report and "row_errors" in old:
            report["row_errors"] = old["row_errors"]
        for pair in args.pairs:
            if pair in old["metrics"]:
                report["metrics"][pair] = old["metrics"][pair]
    save()
    print(f"reference ppl {res['perplexity']:.4f} {res.get('needle', '')} ({res['wall_s']:.0f} s)"
          + (f" attn mass <1 {res['attention_mass']['mean_pos_lt_1']:.3f} <4 {res['attention_mass']['mean_pos_lt_4']:.3f}" if "attention_mass" in res else ""), flush=True)
    for pair in args.pairs:
        if pair in report["metrics"]:
            continue  # kept by --resume
        with variant(pair) as (kt, vt):
            lp, res = run(kt, vt)
        report["metrics"][pair] = {**compare(ref, lp, targets), **res}
        order = ["reference", *args.pairs]
        report["metrics"] = dict(sorted(report["metrics"].items(), key=lambda kv: order.index(kv[0])))
        save()
        r = report["metrics"][pair]
        print(
            f"{pair:<28} KL {r['kl_mean']:.2e} p99 {r['kl_p99']:.2e}  top1 {r['top1_agreement']:.3f}  "
            f"ppl {r['perplexity']:.4f} ({100 * r['perplexity_delta_rel']:+.3f}%)  "
            f"needle {r.get('needle', {}).get('found')}  ({r['wall_s']:.0f} s)"
            + (f"  attn mass <1 {r['attention_mass']['mean_pos_lt_1']:.3f} <4 {r['attention_mass']['mean_pos_lt_4']:.3f}" if "attention_mass" in r else ""),
            flush=True,
        )
    save()
    print(render_markdown(report))
    print(f"wrote {args.out} ({len(ids_list)} tokens, {report['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
