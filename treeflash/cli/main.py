"""The `treeflash` command: generate, serve, bench, fit, train-drafter."""

from __future__ import annotations

import argparse
import importlib
import sys

from treeflash import __version__
from treeflash.errors import TreeflashError

COMMANDS = ("generate", "serve", "bench", "fit", "train_drafter")  # modules of treeflash.cli, each with add_parser

EXAMPLES = """examples:
  treeflash generate --chat "What is the capital of France?"
  treeflash generate --prompt "def quicksort(xs):" --draft ngram
  treeflash serve --port 8000
  treeflash bench --prompts humaneval --draft ngram --baseline ar
  treeflash train-drafter --target ./model --out ./drafter
  treeflash fit --model ./model.gguf --gpu-memory rtx4090 --max-context auto
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="treeflash", description="Lossless speculative decoding on one GPU.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"treeflash {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"treeflash.cli.{name}").add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TreeflashError as e:
        print(f"treeflash {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
