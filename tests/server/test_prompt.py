"""Chat history to prompt: tool-call arguments reach templates as objects, templates without tool
support get the Hermes format, an opened <think> is detected, bad history is a 400."""

import json

import pytest

from treeflash.server.errors import APIError
from treeflash.server.prompt import render_messages
from treeflash.server.protocol import ChatCompletionRequest

# A small template in the style of the Qwen ones: it renders tools and tool_calls itself.
QWEN_STYLE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)
PLAIN = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"


class FakeFrontend:
    bos_token = eos_token = ""
    template_kwargs: dict = {}
    special_tokens = ()

    def __init__(self, template):
        self.chat_template = template

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 100 for c in text]


HISTORY = {
    "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
}


def render(template, body, **kwargs):
    req = ChatCompletionRequest.model_validate_json(json.dumps(body))
    return render_messages(FakeFrontend(template), req.messages, req.tools, True, kwargs or None)


def test_template_with_tool_support_gets_argument_objects_and_thinking():
    p = render(QWEN_STYLE, HISTORY, enable_thinking=True)
    assert "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>" in p.text
    assert "<|im_start|>system\nBe brief." in p.text  # developer -> system
    assert "Weather in\nParis?" in p.text and "<|im_start|>tool\n22 C" in p.text and "<tools>" in p.text
    assert p.in_think and not render(QWEN_STYLE, HISTORY, enable_thinking=False).in_think


def test_template_without_tool_support_gets_the_hermes_format():
    p = render(PLAIN, HISTORY)
    assert p.text.startswith("[system] Be brief.\n\n# Tools")  # tool definitions appended to the system message
    assert "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"" in p.text
    assert "[assistant] <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>" in p.text


@pytest.mark.parametrize("message,fragment", [
    ({"role": "user", "content": None}, "content is required"),
    ({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}, "only allowed on assistant"),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}]}, "must encode a JSON object"),
    ({"role": "user", "content": [{"type": "image_url"}]}, "only text parts"),
])
def test_bad_history_is_a_400(message, fragment):
    with pytest.raises(APIError, match=fragment) as e:
        render(PLAIN, {"messages": [message]})
    assert e.value.status == 400


def test_reserved_template_kwargs_are_refused():
    with pytest.raises(APIError, match="may not set 'messages'"):
        render(PLAIN, {"messages": [{"role": "user", "content": "hi"}]}, messages=[])
