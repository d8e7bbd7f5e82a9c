"""treeflash generate: stream one completion to stdout, a one-line summary to stderr."""

from __future__ import annotations

import argparse
import sys

from treeflash.cli.common import add_model_args, build_engine
from treeflash.cli.template_args import add_template_args, template_kwargs

EXAMPLES = """examples:
  treeflash generate --chat "What is the capital of France?" --temperature 0
  treeflash generate --prompt "def fibonacci(n):" --max-tokens 128 --draft ngram
  treeflash generate --model ./Qwen2.5-Coder-1.5B-Instruct.gguf --draft draft \\
      --draft-model ./Qwen2.5-Coder-0.5B-Instruct.gguf --chat "Write quicksort in Python"
  treeflash generate --chat "Tell me a story" --temperature 0.8 --top-p 0.95 --seed 7
  treeflash generate --chat "Write a haiku" --weights int4 --threads 1   # CPU: the GGUF's 4-bit layers stay 4-bit (~2x)
  treeflash generate --model ./Qwen3.6-27B-MTP.gguf --draft mtp --num-draft 3 --no-think --chat "Sort a list in Rust"
  treeflash generate --model ./Qwen3-8B --chat-template-kwargs '{"enable_thinking": false}' --chat "Hi"
  treeflash generate --model ./Qwen3.5-27B-Q4_K_M.gguf --weights native --chat "Hi"   # GPU: weights stay in their GGUF blocks
"""


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt or a chat message", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="raw text to continue")
    src.add_argument("--chat", help="a user message, wrapped in the model's chat template")
    p.add_argument("--system", default=None, help="a system message for --chat")
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="same seed, same text")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--quiet", action="store_true", help="no loading progress bar")
    add_template_args(p)
    add_model_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from treeflash.engine.chat import render_chat
    from treeflash.engine.request import GenerationRequest
    from treeflash.spec.sampling import SamplingParams

    kwargs = template_kwargs(args)  # before loading: a bad flag fails fast
    engine = build_engine(args, progress=not args.quiet)
    if args.prompt is None and args.chat is None:
        args.chat = "What is the capital of France?"
    if args.chat is not None:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": args.chat}]
        text = render_chat(engine.loaded.chat_template, messages, add_generation_prompt=True, **kwargs)
        ids = engine.encode(text, add_special_tokens=False)
    else:
        ids = engine.encode(args.prompt)
    req = GenerationRequest(
        prompt_ids=tuple(ids),
        sampling=SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed),
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )
    last = None
    for ev in engine.stream(req):
        sys.stdout.write(ev.text)
        sys.stdout.flush()
        last = ev
    sys.stdout.write("\n")
    sys.stdout.flush()  # before the summary on stderr: with 2>&1 they would share a line
    u = last.usage
    decode_s = max(u.seconds - u.first_token_s, 1e-9)
    line = (f"[treeflash] {u.completion_tokens} tokens in {u.seconds:.2f} s: {u.completion_tokens / u.seconds:.1f} tokens/s "
            f"(prompt {u.prompt_tokens} tokens, first token {u.first_token_s * 1000:.0f} ms, "
            f"decode {(u.completion_tokens - 1) / decode_s:.1f} tokens/s)")
    if u.spec:
        line += f" tau {u.spec['tau']:.2f} draft={args.draft}"
        if engine.drafter is not None:
            info = engine.drafter.describe()
            if "budget" in info:
                line += f" budget={info['budget']}"
            if info.get("oracle"):
                line += f" [ORACLE: {info['note']}]"
    print(line, file=sys.stderr)
    return 0
