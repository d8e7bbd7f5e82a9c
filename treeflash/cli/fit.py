"""treeflash fit: will this configuration fit, before a single weight is read?

Reads only the checkpoint's header (a GGUF's tensor table, safetensors JSON headers) and prints
every part of the memory plan (models/memory), the total against the memory there is, a yes/no,
the largest context and verify step that fit, and what to change when it does not fit.
Exit status: 0 when it fits, 1 when it does not, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys

from treeflash.cli.planning import CARDS, fit_report, parse_prefill_chunk, render, report_dict

EXAMPLES = f"""examples:
  treeflash fit                                                   # the embedded default model on this machine's GPU
  treeflash fit --model ./Qwen3.6-27B-Q4_K_M.gguf --gpu-memory rtx4090 --max-context auto --weights native
  treeflash fit --model ./Qwen3.6-27B-Q4_K_M.gguf --gpu-memory 24GiB --max-context 131072 \\
      --cache-type-k q8_0 --cache-type-v tq3_0 --draft dflash --draft-model ./Qwen3.6-27B-DFlash --budget 16
  treeflash fit --model ./Qwen2.5-Coder-1.5B-Instruct.gguf --gpu-memory 8GB --json plan.json
  treeflash fit --device cpu --max-context auto                   # the CPU: plan against the available RAM

--gpu-memory takes auto (this GPU's free memory), a size (24GiB, 24GB, 24000MiB) or a card:
{", ".join(f"{k}={v / 2**30:g}GiB" for k, v in sorted(CARDS.items()))}.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("fit", help="plan memory from the checkpoint's header: does a configuration fit?",
                       description=__doc__.splitlines()[0], epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="Hugging Face directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="the device to plan for (default cuda: works without one)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="runtime dtype (default: bfloat16 on CUDA, float32 on a CPU)")
    p.add_argument("--weights", default="auto", choices=["auto", "float", "int4", "native"],
                   help="auto (default): float, unless a GGUF on CUDA fits only with its blocks kept; float: every weight at --dtype; int4: CPU 4-bit GGUF layers; native: CUDA, GGUF blocks kept packed")
    p.add_argument("--gpu-memory", default="auto", help="memory to plan within: auto, 24GiB, 24GB, 24000MiB or a card name (default auto)")
    p.add_argument("--max-context", default="8192", help="tokens of context: an integer or auto, the most that fits (default 8192)")
    p.add_argument("--prefill-chunk", type=parse_prefill_chunk, default="auto",
                   help="tokens per prefill chunk: auto (2048, or the largest of 1024/512/256 that fits) or an integer")
    p.add_argument("--cache-type-k", default="auto", help="K cache type: auto, bf16, f16, f32, q8_0, q4_0, tq3_0")
    p.add_argument("--cache-type-v", default="auto", help="V cache type: auto, bf16, f16, f32, q8_0, q4_0, tq3_0")
    p.add_argument("--cache-k-exact-layers", type=int, default=0, metavar="N", help="the first N attention layers keep K uncompressed")
    p.add_argument("--draft", default=None, choices=["ngram", "draft", "mtp", "dflash"], help="drafter (default: none)")
    p.add_argument("--draft-model", default=None, help="drafter weights for --draft draft / dflash")
    p.add_argument("--num-draft", type=int, default=5, help="tokens per chain draft for ngram/draft/mtp (default 5)")
    p.add_argument("--drafter-weights", default="float", choices=["float", "q8_0"],
                   help="dflash: the drafter's linear layers at the runtime dtype (default) or as Q8_0 blocks")
    p.add_argument("--budget", default="auto", help="DDTree node budget for dflash: an integer or auto (verify graphs up to 128 nodes)")
    p.add_argument("--no-tree", action="store_true", help="dflash: the plain chain instead of a DDTree")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the plan as JSON to FILE ('-': stdout only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report, header, drafter = fit_report(args, args.device)
    if args.json == "-":
        print(json.dumps(report_dict(report, header, drafter), indent=1))
    else:
        print(render(report, header, drafter))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report_dict(report, header, drafter), f, indent=1)
                f.write("\n")
    sys.stdout.flush()
    return 0 if report.fits else 1
