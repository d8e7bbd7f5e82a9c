"""A live server over the toy engine (tests/engine/toy.py), for tests that need control the real
model cannot give: a slow load (503), slow steps (429, disconnects, shutdown), a scripted failure.

    python -m tests.server.toy_server --port P [--load-delay S] [--step-delay S] [--api-key K] [--max-queue N]
"""

from __future__ import annotations

import argparse
import sys
import time

FAIL_PROMPT = "boom"  # a completion prompt containing this raises inside the engine, mid-generation


def make_engine(draft: str | None, step_delay: float, load_delay: float):
    from tests.engine.toy import toy_loaded
    from treeflash.engine.engine import Engine, EngineConfig

    class ToyEngine(Engine):
        def stream(self, req, cancelled=None):
            fail = self.encode(FAIL_PROMPT)
            ids = list(req.prompt_ids)
            for k, ev in enumerate(super().stream(req, cancelled)):
                if k == 1 and any(ids[i:i + len(fail)] == fail for i in range(len(ids))):
                    raise RuntimeError("scripted failure inside the engine")
                time.sleep(step_delay)
                yield ev

    time.sleep(load_delay)
    return ToyEngine(toy_loaded(), EngineConfig(max_context=256, draft=draft))


def main(argv=None) -> int:
    from treeflash.cli.serve import serve
    from treeflash.server.app import ServerConfig

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-queue", type=int, default=64)
    p.add_argument("--max-body-mb", type=float, default=4.0)
    p.add_argument("--load-delay", type=float, default=0.0)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--draft", default=None)
    p.add_argument("--fail-load", action="store_true")
    a = p.parse_args(argv)
    config = ServerConfig("toy", a.api_key, a.max_queue, int(a.max_body_mb * 1024 * 1024))

    def load():
        if a.fail_load:
            time.sleep(a.load_delay)
            raise RuntimeError("scripted load failure")
        return make_engine(a.draft, a.step_delay, a.load_delay)

    return serve(config, load, "127.0.0.1", a.port, "warning")


if __name__ == "__main__":
    sys.exit(main())
