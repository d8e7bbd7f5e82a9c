"""Tool-call and reasoning parsing on scripted text: whole text == any split into deltas."""

import json
import random

from treeflash.server.reasoning import ReasoningSplitter, split_reasoning
from treeflash.server.tools import ToolCallParser, parse_tool_calls

TWO_CALLS = (
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>\n"
)


def feed_in_pieces(text, sizes):
    p = ToolCallParser()
    content, calls, i = [], [], 0
    for n in sizes:
        c, k = p.feed(text[i:i + n])
        content.append(c)
        calls += k
        i += n
    c, k = p.flush()
    return "".join(content) + c, calls + k


def random_sizes(text, rng):
    sizes, left = [], len(text)
    while left > 0:
        sizes.append(min(left, rng.randint(1, 7)))
        left -= sizes[-1]
    return sizes


def test_two_calls_parsed_with_content():
    content, calls = parse_tool_calls(TWO_CALLS)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Paris", "unit": "c"}
    assert json.loads(calls[1].arguments) == {"tz": "Europe/Paris"}
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id


def test_any_split_equals_whole_text():
    rng = random.Random(0)
    texts = [TWO_CALLS, "plain text, no tools < at all <tool", "a <tool_call>{bad json}</tool_call> b",
             "x <tool_call>{\"name\": \"f\", \"arguments\": {}}", "  \n", "<tool_call>{\"name\": \"f\"}</tool_call>  tail "]
    for text in texts:
        whole_content, whole_calls = parse_tool_calls(text)
        for _ in range(30):
            content, calls = feed_in_pieces(text, random_sizes(text, rng))
            assert content == whole_content, text
            assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]


def test_no_tag_text_is_never_held_beyond_a_partial_tag():
    p = ToolCallParser()
    assert p.feed("Hello <to") == ("Hello", [])  # " <to" might start a tag
    assert p.feed("night") == (" <tonight", [])


def test_bad_blocks_stay_content_and_unclosed_call_is_recovered():
    content, calls = parse_tool_calls("a <tool_call>{bad json}</tool_call> b")
    assert calls == [] and content == "a<tool_call>{bad json}</tool_call> b"
    content, calls = parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}")
    assert content == "" and calls[0].name == "f" and json.loads(calls[0].arguments) == {"x": 1}
    content, calls = parse_tool_calls("<tool_call>{\"nam")
    assert calls == [] and content == "<tool_call>{\"nam"


def test_string_arguments_are_normalized_to_a_json_object():
    _, calls = parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 2}\"}</tool_call>")
    assert json.loads(calls[0].arguments) == {"a": 2}


def test_reasoning_split_whole_and_streamed():
    text = "<think>\nI should greet.\n</think>\n\nHello there!"
    assert split_reasoning(text) == ("\nI should greet.\n", "Hello there!")
    assert split_reasoning("no thinking here") == ("", "no thinking here")
    assert split_reasoning("still thinking when max_tokens hit", in_think=True) == ("still thinking when max_tokens hit", "")
    assert split_reasoning("a</think>b", in_think=True) == ("a", "b")
    rng = random.Random(1)
    for t, in_think in [(text, False), ("  <thi", False), ("<think>x</thi", False), ("plan</think>\n\nanswer", True)]:
        whole = split_reasoning(t, in_think)
        for _ in range(30):
            s, r, c, i = ReasoningSplitter(in_think), [], [], 0
            for n in random_sizes(t, rng):
                a, b = s.feed(t[i:i + n])
                r.append(a)
                c.append(b)
                i += n
            a, b = s.flush()
            assert ("".join(r) + a, "".join(c) + b) == whole, t
