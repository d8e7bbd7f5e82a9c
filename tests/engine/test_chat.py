"""render_chat runs a checkpoint's chat template in a sandbox: Python internals, mutation of the
request's messages and file access are refused with InvalidRequestError; ordinary templates render."""

import pytest

from treeflash.engine.chat import CHATML, render_chat
from treeflash.errors import InvalidRequestError

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_chatml_renders():
    text = render_chat(CHATML, MESSAGES, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(None, MESSAGES, add_generation_prompt=False) == text.removesuffix("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['__builtins__'] }}",
    ],
)
def test_python_internals_are_refused(template):
    with pytest.raises(InvalidRequestError, match="unsafe") as e:
        render_chat(template, MESSAGES)
    assert e.value.param == "messages"


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",
        "{% set _ = messages.append(1) %}{{ messages | length }}",
        "{{ messages.pop() }}",
        "{{ messages[0].update({'content': 'changed'}) }}",
    ],
)
def test_mutating_the_messages_is_refused(template):
    messages = [dict(m) for m in MESSAGES]
    with pytest.raises(InvalidRequestError, match="unsafe"):
        render_chat(template, messages)
    assert messages == MESSAGES  # untouched


def test_unsafe_attribute_never_prints():
    # a lone unsafe attribute is undefined (renders empty), never the Python object
    assert render_chat("[{{ ''.__class__ }}][{{ ''|attr('__class__') }}]", MESSAGES) == "[][]"


@pytest.mark.parametrize("template", ["{% include '/etc/passwd' %}", "{% import 'os' as os %}", "{% extends '/etc/hosts' %}"])
def test_no_file_access(template):
    with pytest.raises(InvalidRequestError):
        render_chat(template, MESSAGES)


def test_bad_template_and_bad_role():
    with pytest.raises(InvalidRequestError, match="does not compile"):
        render_chat("{% for m in messages %}", MESSAGES)
    with pytest.raises(InvalidRequestError, match="nope"):
        render_chat("{{ raise_exception('nope') }}", MESSAGES)
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]\.role"):
        render_chat(CHATML, [{"role": "wizard", "content": "x"}])
