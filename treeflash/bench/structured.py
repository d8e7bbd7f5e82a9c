"""Structured outputs under speculation: speed against plain constrained decoding, and the mask's cost.

    python -m treeflash.bench.structured --out structured.json                      # CPU, the default model
    python -m treeflash.bench.structured --device cuda --draft ngram dflash --out $OUT/structured.json
    python -m treeflash.bench.structured --schemas 2 --max-tokens 32 --out tiny.json # a quick check

For each JSON schema (a fixed set of agent-style ones), at temperature 0: the constrained output of
plain decoding and of each --draft, with tokens/s, tau (tokens per target pass) and whether the output
is token-identical to plain constrained decoding (it must be) and parses as JSON; the same prompt
unconstrained for the speed of the unconstrained path beside it. Then the mask's own cost: the
grammar's allowed set recomputed along the plain output, token by token (llguidance, on the host).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

OBJ = {"type": "object", "additionalProperties": False}
SCHEMAS = [
    ("Describe a person named Alice who is 30.", {**OBJ, "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                                                  "required": ["name", "age"]}),
    ("List three fruits.", {**OBJ, "properties": {"fruits": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3}},
                            "required": ["fruits"]}),
    ("Call the weather tool for Paris.", {**OBJ, "properties": {"tool": {"enum": ["get_weather", "get_time"]},
                                                                "arguments": {**OBJ, "properties": {"city": {"type": "string"}},
                                                                              "required": ["city"]}},
                                          "required": ["tool", "arguments"]}),
    ("Describe a book.", {**OBJ, "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                                                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
                          "required": ["title", "year", "tags"]}),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m treeflash.bench.structured", description=__doc__.splitlines()[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--model", default=None, help="Hugging Face directory or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--draft", nargs="+", default=["ngram"], help="drafters to compare with plain decoding (default: ngram)")
    p.add_argument("--schemas", type=int, default=len(SCHEMAS), help=f"how many of the {len(SCHEMAS)} schemas (default all)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=None, help="PyTorch CPU threads (default: PyTorch's)")
    args = p.parse_args(argv)
    if not 1 <= args.schemas <= len(SCHEMAS):
        p.error(f"--schemas must be in [1, {len(SCHEMAS)}]")

    import torch

    from treeflash.bench.machine import machine, versions
    from treeflash.engine.chat import render_chat
    from treeflash.engine.engine import Engine, EngineConfig
    from treeflash.engine.request import GenerationRequest, Grammar
    from treeflash.models.loader import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device=args.device, progress=False)
    engines = {name: Engine(loaded, EngineConfig(max_context=1024, draft=name)) for name in [None, *args.draft]}
    plain = engines[None]

    def run(engine, ids, grammar):
        text, out, last = engine.complete(GenerationRequest(ids, max_tokens=args.max_tokens, grammar=grammar))
        u = last.usage
        tau = u.spec["tau"] if u.spec else 1.0
        return {"text": text, "ids": out, "tokens": len(out), "seconds": u.seconds, "tok_s": len(out) / u.seconds, "tau": tau}

    warm = tuple(plain.encode("Hello", add_special_tokens=False))
    for engine in engines.values():  # warm-up: kernels, allocations, the tokenizer bridge
        run(engine, warm, Grammar("json_schema", json.dumps(SCHEMAS[0][1])))
    rows, mask_us = [], []
    for prompt, schema in SCHEMAS[: args.schemas]:
        text = render_chat(loaded.chat_template, [{"role": "user", "content": prompt + " Answer in JSON."}], add_generation_prompt=True)
        ids = tuple(plain.encode(text, add_special_tokens=False))
        grammar = Grammar("json_schema", json.dumps(schema))
        ref = run(plain, ids, grammar)
        row = {"prompt": prompt, "plain": _summary(ref), "unconstrained": _summary(run(plain, ids, None)), "draft": {}}
        try:
            json.loads(ref["text"])
            row["valid_json"] = True
        except json.JSONDecodeError:
            row["valid_json"] = False
        for name in args.draft:
            got = run(engines[name], ids, grammar)
            row["draft"][name] = {**_summary(got), "identical": got["ids"] == ref["ids"], "speedup": got["tok_s"] / ref["tok_s"]}
        constraint = plain.grammars.constraint(grammar)
        for tok in ref["ids"]:
            t0 = time.perf_counter()
            constraint.allowed()
            mask_us.append((time.perf_counter() - t0) * 1e6)
            if tok in plain.eos_ids:
                break
            constraint.advance(tok)
        rows.append(row)
    identical = all(d["identical"] for r in rows for d in r["draft"].values())
    result = {
        "bench": "structured",
        "command": "python -m treeflash.bench.structured " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": loaded.source, "device": args.device, "max_tokens": args.max_tokens, "rows": rows,
        "all_identical": identical, "all_valid_json": all(r["valid_json"] for r in rows),
        "mask_us": {"median": statistics.median(mask_us), "p90": sorted(mask_us)[int(0.9 * (len(mask_us) - 1))],
                    "max": max(mask_us), "count": len(mask_us)},
        "speedup_median": {name: statistics.median(r["draft"][name]["speedup"] for r in rows) for name in args.draft},
        "machine": machine(), "versions": versions(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, s in result["speedup_median"].items():
        print(f"{name}: constrained speedup over plain constrained decoding, median {s:.2f}x")
    print(f"mask: median {result['mask_us']['median']:.0f} us, p90 {result['mask_us']['p90']:.0f} us; "
          f"identical: {identical}, valid JSON: {result['all_valid_json']}")
    return 0 if identical else 1


def _summary(run: dict) -> dict:
    return {k: run[k] for k in ("text", "tokens", "seconds", "tok_s", "tau")}


if __name__ == "__main__":
    sys.exit(main())
