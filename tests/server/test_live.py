"""The real server on the embedded default model (SmolLM2-135M-Instruct), through the official
openai client: streamed == non-streamed, usage, stop strings across multi-token deltas (ngram
drafting commits several tokens per step), n, seeds, logprobs, top_k / min_p, max_completion_tokens,
tool-call history, tokenize, metrics. (Tool calls and thinking in the output, which this model does
not write on cue, are in test_scripted_live.py.)"""

import httpx
import pytest
from openai import OpenAI

from tests.server.live import CONTEXT, KEY, MODEL

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Name three colors."}]
COUNTING = "1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2,"


def stream_chat(client, **kw):
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_models_and_health(server, client, http):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(server.url + "/health").json()  # no key needed for probes
    assert health["status"] == "ok" and health["model"] == MODEL
    assert http.get(f"/v1/models/{MODEL}").json()["max_model_len"] == CONTEXT
    assert http.get("/models/other").status_code == 404


def test_chat_streamed_equals_non_streamed_and_usage_adds_up(client):
    full = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)
    chunks, text = stream_chat(client, messages=HELLO, max_tokens=8, temperature=0)
    assert text == full.choices[0].message.content and text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage == full.usage
    assert usage.prompt_tokens + usage.completion_tokens == usage.total_tokens and 0 < usage.completion_tokens <= 8
    assert full.choices[0].finish_reason in ("stop", "length")


def test_completions_streamed_equals_non_streamed(client, http):
    full = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    streamed = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full.choices[0].text
    assert streamed[-1].usage == full.usage
    # the same route without the /v1 prefix
    raw = http.post("/completions", json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
    assert raw.json()["choices"][0]["text"] == full.choices[0].text


def test_stop_strings_cut_exactly_inside_multi_token_deltas(client):
    args = dict(model=MODEL, prompt=COUNTING, max_tokens=24, temperature=0, logprobs=0)
    chunks = [c for c in client.completions.create(stream=True, **args) if c.choices]
    full = "".join(c.choices[0].text for c in chunks)
    # a delta that carries several tokens (ngram drafts accepted on this repetitive prompt)
    start, cut_at = 0, None
    for c in chunks:
        text = c.choices[0].text
        if len(c.choices[0].logprobs.tokens) >= 2 and len(text) >= 3 and start > 0:
            cut_at = start + 1  # the stop string starts inside this delta and runs into the next
            break
        start += len(text)
    assert cut_at is not None, f"no multi-token delta in {[c.choices[0].text for c in chunks]}"
    stop = full[cut_at:cut_at + 4]
    expected = full[: full.find(stop)]
    for stream in (False, True):
        if stream:
            got = [c for c in client.completions.create(stream=True, stop=[stop, "never-there"], **args) if c.choices]
            text, finish = "".join(c.choices[0].text for c in got), got[-1].choices[0].finish_reason
        else:
            r = client.completions.create(stop=stop, **args)
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert text == expected and finish == "stop", (stop, text, expected)


def test_n2_and_seed_offsets(client):
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0)
    two = client.completions.create(n=2, seed=7, **args)
    assert [c.index for c in two.choices] == [0, 1]
    again = client.completions.create(n=2, seed=7, **args)
    assert [c.text for c in again.choices] == [c.text for c in two.choices]
    shifted = client.completions.create(n=1, seed=8, **args)  # choice i runs with seed + i
    assert shifted.choices[0].text == two.choices[1].text
    streamed = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, n=2, seed=3, stream=True))
    finishes = [c.choices[0].index for c in streamed if c.choices and c.choices[0].finish_reason]
    assert sorted(finishes) == [0, 1]


def test_chat_and_completion_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for lp in content:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 3
        assert lp.token == lp.top_logprobs[0].token  # greedy picks the most likely token
    c = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0, logprobs=2)
    lps = c.choices[0].logprobs
    assert len(lps.tokens) == len(lps.token_logprobs) == len(lps.top_logprobs) == c.usage.completion_tokens
    assert all(1 <= len(t) <= 2 for t in lps.top_logprobs)


def test_top_k_1_and_min_p_1_keep_only_the_greedy_token(client):
    """At temperature 2 this seed leaves the greedy path; top_k=1 or min_p=1 must hold it there, drafted
    tokens included (ngram drafts are verified against the filtered distribution)."""
    args = dict(model=MODEL, prompt="The capital of France is", max_tokens=3)
    greedy = client.completions.create(temperature=0, extra_body={"ignore_eos": True}, **args).choices[0].text
    hot = client.completions.create(temperature=2.0, seed=11, extra_body={"ignore_eos": True}, **args).choices[0].text
    assert hot != greedy
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        chunks = client.completions.create(temperature=2.0, seed=11, stream=True, extra_body={"ignore_eos": True, **extra}, **args)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == greedy, extra


def test_max_completion_tokens(client):
    kw = dict(messages=HELLO, max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(model=MODEL, **kw)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    chunks, text = stream_chat(client, **kw)
    assert text == r.choices[0].message.content and chunks[-1].usage == r.usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOL_HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_c\": 22}"},
]


def test_tool_call_round_trip_renders_and_answers(client, http):
    r = client.chat.completions.create(model=MODEL, messages=TOOL_HISTORY, tools=[WEATHER_TOOL], max_tokens=8, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    ids = http.post("/tokenize", json={"messages": TOOL_HISTORY, "tools": [WEATHER_TOOL]}).json()["tokens"]
    prompt = http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    # the tool definitions, the past call (arguments decoded to an object) and the result all reach the model
    assert "get_weather" in prompt and "<tool_call>" in prompt and "\"city\": \"Paris\"" in prompt and "22" in prompt


def test_tokenize_detokenize(http):
    r = http.post("/v1/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
    assert r["count"] == len(r["tokens"]) > 0 and r["max_model_len"] == CONTEXT
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "Hello world"
    chat = http.post("/tokenize", json={"messages": HELLO, "chat_template_kwargs": {"enable_thinking": False}}).json()
    text = http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert text.endswith("Name three colors.<|im_end|>\n<|im_start|>assistant\n")


def test_metrics(server, client):
    client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    for name in ('treeflash_requests_total{route="/chat/completions",status="200"}', "treeflash_time_to_first_token_seconds_count",
                 "treeflash_time_per_output_token_seconds_count", "treeflash_tokens_per_second_count", "treeflash_queue_depth",
                 "treeflash_spec_tau", 'treeflash_spec_acceptance{depth="1"}', "treeflash_spec_steps_by_budget_total{budget=",
                 'treeflash_spec_step_budget_bucket{le="+Inf"}'):
        assert name in text, name


def test_openai_errors(server, client):
    import openai

    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-17", messages=HELLO, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=f"exceeds the context length {CONTEXT}"):
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=CONTEXT)
    with pytest.raises(openai.BadRequestError, match=f"the prompt is 2100 tokens, but the context is {CONTEXT}"):
        client.completions.create(model=MODEL, prompt=[5] * 2100, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="n: Input should be less than or equal to 8"):
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, n=9)
