"""A live server over the toy engine (tests/engine/toy.py), for tests that need control the real
model cannot give: a slow load (503), slow steps (429, disconnects, shutdown), a scripted failure,
scripted tool calls and thinking (tests/server/scripted.py).

    python -m tests.server.toy_server [--load-delay S] [--step-delay S] [--fail-load] [treeflash serve flags]

Every flag but the three toy ones goes through the real `treeflash serve` parser and
`server_config` (--port, --api-key, --max-queue, --max-body-mb, --served-model-name, --draft,
--max-context, ...), with `--served-model-name toy --max-context 1024 --threads 1 --log-level warning` as defaults (one
PyTorch thread: two wait on each other at every step on a busy 2-core machine).
The tokenizer is one token per ASCII character, so the prompt reads back exactly.
"""

from __future__ import annotations

import argparse
import sys
import time

FAIL_PROMPT = "boom"  # a completion prompt containing this raises inside the engine, at its second event
LATE_FAIL_PROMPT = "slowboom"  # ... at its 40th event (two seconds in at --step-delay 0.05)
TOY_DEFAULTS = ["--served-model-name", "toy", "--max-context", "1024", "--threads", "1", "--log-level", "warning"]


def make_engine(draft: str | None, step_delay: float, load_delay: float, max_context: int = 1024, prefix_cache_mb: float = 0.0):
    from tests.engine.toy import ToyLoaded
    from tests.models.hf_oracle import make_pair
    from tests.server.scripted import TEMPLATE, AsciiTokenizer, script_for, scripted_events
    from treeflash.engine.engine import Engine, EngineConfig
    from treeflash.engine.prefix_cache import PrefixCacheConfig

    class ToyEngine(Engine):
        def stream(self, req, cancelled=None):
            ids = list(req.prompt_ids)
            script = script_for(self.decode(ids))
            if script is not None:
                self.check_fits(len(ids), req.max_tokens)
                with self.lock:
                    yield from scripted_events(script, self.encode, req, cancelled, step_delay)
                return
            fail_at = None
            for prompt, k in ((LATE_FAIL_PROMPT, 40), (FAIL_PROMPT, 1)):
                marker = self.encode(prompt)
                if any(ids[i:i + len(marker)] == marker for i in range(len(ids))):
                    fail_at = k
                    break
            for k, ev in enumerate(super().stream(req, cancelled)):
                if k == fail_at:
                    raise RuntimeError("scripted failure inside the engine")
                time.sleep(step_delay)
                yield ev

    time.sleep(load_delay)
    _, model = make_pair("qwen3", max_position_embeddings=2048)  # room for chat prompts at one token per character
    loaded = ToyLoaded(model, AsciiTokenizer(), model.config, TEMPLATE)
    return ToyEngine(loaded, EngineConfig(max_context=max_context, draft=draft, prefix_cache=PrefixCacheConfig(max_mb=prefix_cache_mb)))


def main(argv=None) -> int:
    from treeflash.cli.main import build_parser
    from treeflash.cli.serve import serve, server_config

    toy = argparse.ArgumentParser(add_help=False)
    toy.add_argument("--load-delay", type=float, default=0.0)
    toy.add_argument("--step-delay", type=float, default=0.0)
    toy.add_argument("--fail-load", action="store_true")
    t, rest = toy.parse_known_args(argv)
    args = build_parser().parse_args(["serve", *TOY_DEFAULTS, *rest])
    config = server_config(args)

    def load():
        if t.fail_load:
            time.sleep(t.load_delay)
            raise RuntimeError("scripted load failure")
        import torch

        torch.set_num_threads(args.threads)
        return make_engine(args.draft, t.step_delay, t.load_delay, args.max_context, args.prefix_cache_mb)

    return serve(config, load, args.host, args.port, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
