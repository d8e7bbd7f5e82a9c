"""treeflash serve: the OpenAI-compatible HTTP server (FastAPI + uvicorn).

The socket opens first and the model loads on the engine's thread behind it, so a supervisor can
poll GET /health (503 while loading, 200 when ready) instead of guessing a start-up delay.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from treeflash.cli.common import add_model_args, build_engine
from treeflash.cli.planning import plan_at_start
from treeflash.cli.template_args import add_template_args, template_kwargs
from treeflash.errors import ModelLoadError
from treeflash.server.tools import PARSER_CHOICES
from treeflash.models.hub import parse_hub_id

EXAMPLES = """examples:
  treeflash serve                                    # the embedded SmolLM2-135M-Instruct on 127.0.0.1:8000
  treeflash serve --draft ngram --port 8080 --api-key secret
  treeflash serve --model ./Qwen2.5-Coder-1.5B-Instruct.gguf --served-model-name qwen-coder \\
      --draft draft --draft-model ./Qwen2.5-Coder-0.5B-Instruct.gguf --max-queue 16
  treeflash serve --model ./Qwen3.6-27B-MTP-Q4_K_M.gguf --draft mtp --num-draft 3 --no-think   # XML tool calls: auto
  treeflash serve --model ./Qwen3-8B --chat-template-kwargs '{"enable_thinking": false}' --tool-call-parser json
  treeflash serve --host 0.0.0.0 --model Qwen/Qwen2.5-Coder-1.5B-Instruct   # from the Hub (HF_TOKEN, HF_HUB_OFFLINE apply)
  treeflash serve --model Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:qwen2.5-coder-1.5b-instruct-q8_0.gguf

  curl http://127.0.0.1:8000/health
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32, "stream": true}'

  curl http://127.0.0.1:8000/v1/messages -H 'Content-Type: application/json' \
      -d '{"model": "SmolLM2-135M-Instruct", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]}'
  treeflash serve --default-max-tokens 1024 --max-tokens-cap 4096 --responses-store 64

routes (each also without /v1): POST /v1/chat/completions, POST /v1/completions, POST /v1/messages,
POST /v1/messages/count_tokens, POST /v1/responses, GET /v1/models, POST /tokenize, POST /detokenize,
GET /health, GET /metrics (Prometheus). See docs/server.md and docs/apis.md; containers, Helm and the
inference gateway: docs/deploy.md.
"""

DEFAULT_NAME = "SmolLM2-135M-Instruct"
HEAD_BUFFER_BYTES = 1024 * 1024  # see serve()


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server", description=__doc__.splitlines()[0],
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route but /health and /metrics")
    s.add_argument("--served-model-name", default=None,
                   help=f"the model id clients send and /v1/models lists (default: the model file's name, or {DEFAULT_NAME})")
    s.add_argument("--max-queue", type=int, default=64, help="requests that may wait for the engine; more get 429 (default 64)")
    s.add_argument("--max-body-mb", type=float, default=4.0, help="largest request body in MB; larger gets 413 (default 4)")
    s.add_argument("--default-max-tokens", type=int, default=4096,
                   help="max_tokens for a request that sends none (or the room the context leaves, if less; default 4096)")
    s.add_argument("--max-tokens-cap", type=int, default=None,
                   help="the most max_tokens a request may ask for; more gets a 400 (default: only the context bounds it)")
    s.add_argument("--responses-store", type=int, default=256,
                   help="responses kept in memory for /v1/responses previous_response_id, oldest dropped first (default 256; 0: none)")
    s.add_argument("--prefix-cache-mb", type=float, default=0.0,
                   help="MiB for the prefix cache (recurrent-state snapshots, a drafter's stored hidden rows): a prompt "
                        "that starts like the last one resumes its KV instead of prefilling it again (default 0: off)")
    s.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request body may take to arrive; slower gets 408 (default 30)")
    s.add_argument("--allowed-hosts", default="",
                   help="comma-separated Host names answered besides localhost, 127.0.0.1 and [::1] ('*': any). "
                        "On a loopback --host only those are answered (DNS rebinding); elsewhere Host is checked only when this is set")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default info")
    s.add_argument("--tool-call-parser", default="auto", choices=list(PARSER_CHOICES),
                   help="how the model writes tool calls: json (Hermes: Qwen2.5, Qwen3), xml (qwen3_coder: Qwen3-Coder, "
                        "Qwen3.5, Qwen3.6), or auto (default: read off the chat template)")
    add_template_args(p)
    add_model_args(p)
    p.set_defaults(func=run)


def served_name(model: str | None) -> str:
    """The default --served-model-name: a file's stem, a directory's name, a Hub repository's id."""
    if model is None:
        return DEFAULT_NAME
    path = Path(model)
    hub = None if path.expanduser().exists() else parse_hub_id(model)
    if hub is not None:
        return Path(hub.filename).stem if hub.filename else hub.repo_id
    return path.stem if path.suffix.lower() == ".gguf" else path.name or model


def server_config(args: argparse.Namespace):
    """The ServerConfig the parsed `treeflash serve` flags describe (raises InvalidRequestError on bad values)."""
    from treeflash.server.app import ServerConfig
    from treeflash.server.frontend import TokenLimits
    from treeflash.server.hosts import HostPolicy

    return ServerConfig(
        served_model_name=served_name(args.model) if args.served_model_name is None else args.served_model_name,
        api_key=args.api_key,
        max_queue=args.max_queue,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        tool_call_parser=args.tool_call_parser,
        chat_template_kwargs=template_kwargs(args),
        limits=TokenLimits(args.default_max_tokens, args.max_tokens_cap),
        responses_store=args.responses_store,
        body_timeout_s=args.body_timeout,
        hosts=HostPolicy(args.host, tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip())),
    )


def run(args: argparse.Namespace) -> int:
    if args.model is not None and not Path(args.model).expanduser().exists() and parse_hub_id(args.model) is None:
        raise ModelLoadError(f"{args.model}: no such file or directory; pass a Hugging Face model directory, a .gguf file, "
                             f"or a Hub id (org/name, org/name:file.gguf; fetched while /health answers 503)")
    config = server_config(args)
    args.start_plan = plan_at_start(args)  # before the socket opens: a configuration that cannot fit exits with status 2
    print(f"treeflash serve: {args.start_plan.summary}", file=sys.stderr, flush=True)
    if args.threads is None and args.device != "cuda":
        # the server's event loop and HTTP threads share the cores with PyTorch's: with PyTorch's
        # default (one thread per core) every op waits for a preempted worker (36x slower per
        # token measured on the 2-core machine, docs/server.md); --threads N overrides
        args.threads = 1
    return serve(config, lambda: build_engine(args, progress=False), args.host, args.port, args.log_level)


def serve(config, load: Callable[[], object], host: str, port: int, log_level: str = "info") -> int:
    """Run until SIGINT/SIGTERM. Returns 2 if the model failed to load (the server then exits by itself)."""
    import uvicorn

    from treeflash.server.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    failures: list[str] = []
    holder: list[uvicorn.Server] = []

    def on_load_failed(message: str) -> None:
        failures.append(message)
        holder[0].should_exit = True

    app = create_app(config, load, on_load_failed)
    worker = app.state.treeflash.worker

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            worker.begin_stop()  # in-flight generations end at their next step, so the graceful wait is short
            await super().shutdown(sockets)

    # h11 buffers a request head up to this size; the Gate (treeflash.server.guard) then refuses heads
    # over MAX_HEADER_BYTES with a 431. h11's own limit is only checked on a head that is still
    # incomplete after a read, and one read takes up to 256 KB, so it cannot be the 64 KB limit
    # itself: a 100 KB head arriving in one read would pass it. Heads over this bound get h11's plain 400.
    uv_config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10,
                               http="h11", h11_max_incomplete_event_size=HEAD_BUFFER_BYTES)
    server = Server(uv_config)
    holder.append(server)
    print(f"treeflash serve: http://{host}:{port}/v1 model {config.served_model_name!r} (loading; GET /health answers 200 when ready)",
          file=sys.stderr, flush=True)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, after the graceful shutdown
        pass
    if failures:
        print(f"treeflash serve: error: the model failed to load: {failures[0]}", file=sys.stderr)
        return 2
    return 0
