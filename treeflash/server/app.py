"""The OpenAI-compatible HTTP API: routes only. Every route answers with and without the /v1 prefix.

A handler validates (400), checks the model name (404), builds the engine's requests, submits
one job to the worker (429 when the queue is full, 503 while loading) and returns the job's
chunks either streamed or folded. Nothing here touches tensors, and the engine never sees JSON.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from treeflash.errors import InvalidRequestError
from treeflash.server.anthropic.routes import add_routes as add_anthropic_routes
from treeflash.server.responses.routes import add_routes as add_responses_routes
from treeflash.server.chunks import ReplyContext, chat_chunks, completion_chunks, fold_chat, fold_completion
from treeflash.server.errors import APIError, bad_request
from treeflash.server.frontend import Frontend, TokenLimits
from treeflash.server.guard import Gate, read_body
from treeflash.server.hosts import HostPolicy
from treeflash.server.metrics import Metrics
from treeflash.server.prompt import (RESERVED_TEMPLATE_KWARGS, chat_prompt, check_token_ids, completion_prompt_ids,
                                     forced_tool_grammar, generation_requests, render_messages, tool_parser_factory)
from treeflash.server.protocol import (MAX_N, ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest,
                                       parse)
from treeflash.server.streaming import OPENAI_SSE, JobStream, SSEFormat, folded_response
from treeflash.server.tools import tool_call_form
from treeflash.server.worker import Job, Worker

log = logging.getLogger("treeflash.server")


@dataclass(frozen=True)
class ServerConfig:
    served_model_name: str
    api_key: str | None = None
    max_queue: int = 64  # requests waiting for the engine (the running one not counted)
    max_body_bytes: int = 4 * 1024 * 1024
    tool_call_parser: str = "auto"  # auto (from the chat template) | json | xml: server/tools.py
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # defaults a request's chat_template_kwargs override
    limits: TokenLimits = TokenLimits()
    responses_store: int = 256  # responses kept in memory for previous_response_id (0: none)
    body_timeout_s: float = 30.0  # the whole request body must arrive within this (408 otherwise)
    hosts: HostPolicy = HostPolicy()  # the Host headers answered (server/hosts.py); serve() passes the bound address

    def __post_init__(self) -> None:
        tool_call_form(None, self.tool_call_parser)  # validates the choice
        for key in RESERVED_TEMPLATE_KWARGS:
            if key in self.chat_template_kwargs:
                raise InvalidRequestError(f"--chat-template-kwargs may not set {key!r}", "chat_template_kwargs")
        if not self.served_model_name:
            raise InvalidRequestError("--served-model-name must be non-empty", "served_model_name")
        if self.max_queue < 1:
            raise InvalidRequestError(f"--max-queue must be >= 1, got {self.max_queue}", "max_queue")
        if self.responses_store < 0:
            raise InvalidRequestError(f"--responses-store must be >= 0, got {self.responses_store}", "responses_store")
        if not self.body_timeout_s > 0:
            raise InvalidRequestError(f"--body-timeout must be > 0 seconds, got {self.body_timeout_s}", "body_timeout")
        if self.max_body_bytes < 1024:
            raise InvalidRequestError(f"the body limit must be >= 1024 bytes, got {self.max_body_bytes}", "max_body_bytes")


class ServerState:
    def __init__(self, config: ServerConfig, load: Callable[[], object], on_load_failed: Callable[[str], None] | None):
        self.config = config
        self.created = int(time.time())
        self._load = load
        self.front: Frontend | None = None
        self.worker = Worker(self._load_engine, config.max_queue, on_load_failed)
        self.metrics = Metrics(self.worker, config.served_model_name)

    def _load_engine(self):
        engine = self._load()
        self.front = Frontend(engine, self.config.tool_call_parser, self.config.chat_template_kwargs,
                              self.config.limits)  # before the worker reports ready
        return engine

    def frontend(self) -> Frontend:
        if self.worker.state != "ready" or self.front is None:
            if self.worker.state == "loading":
                raise APIError(503, "the model is still loading; retry when GET /health answers 200")
            raise APIError(503, f"the model is not available ({self.worker.state}): {self.worker.load_error or 'shutting down'}")
        return self.front

    async def body(self, request: Request) -> bytes:
        return await read_body(request, self.config.max_body_bytes, self.config.body_timeout_s)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.served_model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.config.served_model_name!r}",
                           "model", "model_not_found")

    def submit(self, gens) -> Job:
        job = Job(gens, asyncio.get_running_loop())
        self.worker.submit(job)
        return job

    async def respond(self, request: Request, stream: bool, chunks, fold, job: Job, arrived: float,
                      sse: SSEFormat = OPENAI_SSE) -> Response:
        def on_end() -> None:
            self.metrics.observe_job(job, arrived)

        if stream:
            return JobStream(chunks, job, self.worker, on_end, sse)
        return await folded_response(fold, chunks, job, self.worker, request.receive, on_end)


def create_app(config: ServerConfig, load: Callable[[], object], on_load_failed: Callable[[str], None] | None = None) -> FastAPI:
    """load() -> Engine runs on the worker thread once the server is up; /health answers 503 until it returns."""
    state = ServerState(config, load, on_load_failed)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.worker.start()
        yield
        await run_in_threadpool(state.worker.stop)

    app = FastAPI(title="treeflash", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.treeflash = state
    app.add_middleware(Gate, api_key=config.api_key, metrics=state.metrics, hosts=config.hosts)
    _add_error_handlers(app)

    async def chat_completions(request: Request) -> Response:
        arrived = time.perf_counter()
        fe = state.frontend()
        req = parse(ChatCompletionRequest, await state.body(request))
        state.check_model(req.model)
        prompt = await run_in_threadpool(chat_prompt, fe, req)
        grammar = forced_tool_grammar(fe, req.forced_tool_choice(), req.tools, prompt, req.max_tool_calls, req.grammar())
        grammar = await run_in_threadpool(fe.check_grammar, grammar)
        gens = generation_requests(fe, req, [prompt.ids], req.num_logprobs, grammar)
        job = state.submit(gens)
        ctx = ReplyContext(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), config.served_model_name, len(prompt.ids),
                           include_usage=req.include_usage or not req.stream)
        chunks = chat_chunks(job, ctx, fe.token_text, prompt.in_think, tool_parser_factory(fe, req))
        return await state.respond(request, req.stream, chunks, fold_chat, job, arrived)

    async def completions(request: Request) -> Response:
        arrived = time.perf_counter()
        fe = state.frontend()
        req = parse(CompletionRequest, await state.body(request))
        state.check_model(req.model)
        prompts = req.prompts()
        if len(prompts) * req.n > MAX_N:
            raise bad_request(f"{len(prompts)} prompts x n={req.n} = {len(prompts) * req.n} choices; the limit is {MAX_N}", "n")
        grammar = req.grammar()
        prompt_ids = await run_in_threadpool(completion_prompt_ids, fe, prompts)
        grammar = await run_in_threadpool(fe.check_grammar, grammar)
        gens = generation_requests(fe, req, prompt_ids, req.logprobs, grammar)
        job = state.submit(gens)
        ctx = ReplyContext(f"cmpl-{uuid.uuid4().hex}", int(time.time()), config.served_model_name, sum(map(len, prompt_ids)),
                           include_usage=req.include_usage or not req.stream)
        chunks = completion_chunks(job, ctx, fe.token_text)
        return await state.respond(request, req.stream, chunks, fold_completion, job, arrived)

    async def tokenize(request: Request) -> Response:
        fe = state.frontend()
        req = parse(TokenizeRequest, await state.body(request))
        state.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("send exactly one of prompt and messages", "prompt")
        if req.prompt is not None:
            ids = await run_in_threadpool(fe.encode, req.prompt, req.add_special_tokens)
        else:
            if not req.messages:
                raise bad_request("messages must be a non-empty list", "messages")
            rendered = await run_in_threadpool(render_messages, fe, req.messages, req.tools, req.add_generation_prompt,
                                               req.chat_template_kwargs)
            ids = rendered.ids
        return JSONResponse({"count": len(ids), "max_model_len": fe.max_context, "tokens": ids})

    async def detokenize(request: Request) -> Response:
        fe = state.frontend()
        req = parse(DetokenizeRequest, await state.body(request))
        state.check_model(req.model)
        check_token_ids(fe, req.tokens, "tokens")
        return JSONResponse({"prompt": await run_in_threadpool(fe.decode, req.tokens)})

    def model_card() -> dict:
        return {"id": config.served_model_name, "object": "model", "created": state.created, "owned_by": "treeflash",
                "max_model_len": state.front.max_context if state.front else None}

    async def list_models() -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def get_model(name: str) -> Response:
        state.check_model(name)
        return JSONResponse(model_card())

    async def health() -> Response:
        w = state.worker
        if w.state == "ready":
            return JSONResponse({"status": "ok", "model": config.served_model_name, "queue_depth": w.queue_depth,
                                 "load_seconds": round(w.load_seconds, 2)})
        if w.state == "loading":
            return APIError(503, "the model is loading", code="loading").response()
        return APIError(503, f"not serving ({w.state}): {w.load_error or 'shutting down'}", code=w.state).response()

    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    for prefix in ("/v1", ""):
        app.add_api_route(prefix + "/chat/completions", chat_completions, methods=["POST"])
        app.add_api_route(prefix + "/completions", completions, methods=["POST"])
        app.add_api_route(prefix + "/tokenize", tokenize, methods=["POST"])
        app.add_api_route(prefix + "/detokenize", detokenize, methods=["POST"])
        app.add_api_route(prefix + "/models", list_models, methods=["GET"])
        app.add_api_route(prefix + "/models/{name:path}", get_model, methods=["GET"])
        app.add_api_route(prefix + "/health", health, methods=["GET"])
        app.add_api_route(prefix + "/metrics", metrics, methods=["GET"])
    add_anthropic_routes(app, state)
    add_responses_routes(app, state)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> Response:
        return e.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> Response:
        err = (e.errors() or [{}])[0]
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        return bad_request(f"{loc or 'request'}: {err.get('msg', 'invalid')}", loc or None).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        return APIError(e.status_code, message).response(request.url.path)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return APIError(500, f"internal error: {type(e).__name__}: {e}").response(request.url.path)
