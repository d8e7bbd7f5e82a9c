"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's wire format over the same job,
parsers, limits, API key, cancellation and metrics as chat completions (server/app.py ServerState).

Errors on these routes are in Anthropic's envelope (server/errors.py picks it by path)."""

from __future__ import annotations

import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from treeflash.server.anthropic.events import MessageContext, error_event, fold_message, message_events
from treeflash.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from treeflash.server.output import job_parts, tool_parser_for
from treeflash.server.prompt import forced_tool_grammar, render_messages, sampling_params, single_request
from treeflash.server.protocol import parse
from treeflash.server.streaming import SSEFormat, encode_named_event


ANTHROPIC_SSE = SSEFormat(encode_named_event, error_event, None)


def add_routes(app: FastAPI, state) -> None:  # state: server.app.ServerState
    async def messages(request: Request) -> Response:
        arrived = time.perf_counter()
        fe = state.frontend()
        req = parse(MessagesRequest, await state.body(request))
        state.check_model(req.model)
        tools = req.chat_tools()
        prompt = await run_in_threadpool(render_messages, fe, req.chat_messages(), tools, True, req.template_kwargs())
        sampling = sampling_params(req.temperature, req.top_p, req.top_k)
        grammar = forced_tool_grammar(fe, req.forced_tool_choice(), tools, prompt, req.max_tool_calls, req.grammar())
        grammar = await run_in_threadpool(fe.check_grammar, grammar)
        gen = single_request(fe, prompt.ids, sampling, req.max_tokens, tuple(req.stop_sequences or ()), grammar=grammar)
        job = state.submit([gen])
        ctx = MessageContext(f"msg_{uuid.uuid4().hex}", state.config.served_model_name, len(prompt.ids))
        parser = tool_parser_for(fe.tool_form, tools, req.max_tool_calls) if req.uses_tools else None
        events = message_events(job_parts(job, prompt.in_think, parser), ctx)
        return await state.respond(request, req.stream, events, fold_message, job, arrived, ANTHROPIC_SSE)

    async def count_tokens(request: Request) -> Response:
        fe = state.frontend()
        req = parse(CountTokensRequest, await state.body(request))
        state.check_model(req.model)
        prompt = await run_in_threadpool(render_messages, fe, req.chat_messages(), req.chat_tools(), True, req.template_kwargs())
        return JSONResponse({"input_tokens": len(prompt.ids)})

    for prefix in ("/v1", ""):
        app.add_api_route(prefix + "/messages", messages, methods=["POST"])
        app.add_api_route(prefix + "/messages/count_tokens", count_tokens, methods=["POST"])
