"""POST /v1/responses: the OpenAI Responses wire format over the same job, parsers, limits, API
key, cancellation and metrics as chat completions (server/app.py ServerState); previous_response_id
through a bounded in-memory store (server/responses/store.py). Errors are in OpenAI's envelope."""

from __future__ import annotations

import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from treeflash.server.output import job_parts, tool_parser_for
from treeflash.server.prompt import forced_tool_grammar, render_messages, sampling_params, single_request
from treeflash.server.protocol import parse
from treeflash.server.responses.events import ResponseContext, error_event, fold_response, response_events
from treeflash.server.responses.protocol import Item, ResponsesRequest, chat_messages
from treeflash.server.responses.store import ResponseStore
from treeflash.server.streaming import SSEFormat, encode_named_event


RESPONSES_SSE = SSEFormat(encode_named_event, error_event, None)
NO_THINKING_EFFORTS = ("none", "minimal")  # reasoning.effort values that switch a thinking template's thinking off


def add_routes(app: FastAPI, state) -> None:  # state: server.app.ServerState
    store = ResponseStore(state.config.responses_store)
    app.state.responses_store = store

    async def responses(request: Request) -> Response:
        arrived = time.perf_counter()
        fe = state.frontend()
        req = parse(ResponsesRequest, await state.body(request))
        state.check_model(req.model)
        history = store.conversation(req.previous_response_id) if req.previous_response_id else []
        items = history + req.input_items()
        messages = chat_messages(req.instructions, items)
        kwargs = None
        if req.reasoning is not None and req.reasoning.effort is not None:
            kwargs = {"enable_thinking": req.reasoning.effort not in NO_THINKING_EFFORTS}
        tools = req.chat_tools()
        prompt = await run_in_threadpool(render_messages, fe, messages, tools, True, kwargs)
        grammar = forced_tool_grammar(fe, req.forced_tool_choice(), tools, prompt, req.max_tool_calls_per_turn, req.grammar())
        grammar = await run_in_threadpool(fe.check_grammar, grammar)
        gen = single_request(fe, prompt.ids, sampling_params(req.temperature, req.top_p, None), req.max_output_tokens,
                             prompt_param="input", limit_param="max_output_tokens", grammar=grammar)
        job = state.submit([gen])
        response_id = f"resp_{uuid.uuid4().hex}"

        def on_done(output: list[dict]) -> None:
            if req.store is not False:
                store.put(response_id, items + [Item.model_validate(o) for o in output])

        ctx = ResponseContext(response_id, state.config.served_model_name, len(prompt.ids), _echo(req),
                              lambda text: len(fe.encode(text, add_special_tokens=False)), on_done)
        parser = tool_parser_for(fe.tool_form, tools, req.max_tool_calls_per_turn) if req.uses_tools else None
        events = response_events(job_parts(job, prompt.in_think, parser), ctx)
        return await state.respond(request, req.stream, events, fold_response, job, arrived, RESPONSES_SSE)

    for prefix in ("/v1", ""):
        app.add_api_route(prefix + "/responses", responses, methods=["POST"])


def _echo(req: ResponsesRequest) -> dict:
    """The request fields a Response repeats, with the defaults that applied."""
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning.model_dump() if req.reasoning else {"effort": None, "summary": None},
        "store": req.store is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "text": {"format": (req.text.format if req.text is not None and req.text.format else None) or {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "truncation": req.truncation or "disabled",
        "metadata": req.metadata or {},
        "user": req.user,
    }
