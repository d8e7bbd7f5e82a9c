"""tool_choice "required" / a named function: the output constrained to tool calls (an llguidance Lark grammar).

Every wire format's choice becomes a `ForcedChoice` (chat completions' "required" and
{"type": "function", "function": {"name"}}, Responses' "required" and {"type": "function", "name"},
Anthropic's {"type": "any"} and {"type": "tool", "name"}); `tool_call_grammar` writes the grammar
of one or more calls (exactly one with `max_calls` 1) in the form the output parser reads
(server/tools.py), the layout the chat templates show the model, "\\n" between calls:

- json: `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`. The object is an inline
  `%json` schema: the name one of the allowed tools (a const per tool), ARGS valid against that
  tool's parameters schema (everything llguidance enforces; a keyword it does not implement is a
  400 naming `tools`), and, when the schema declares properties and says nothing of
  additionalProperties, only those (a model that invents an argument never ends it otherwise).
  Separators ", " and ": ", no other whitespace (how templates render past calls).
- xml: `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>`.
  The function names are the allowed tools'; the parameters are the declared ones, in the schema's
  order, each at most once, the required ones present (any name when the schema declares none and
  does not forbid extra properties). A value is read back by the schema type (tool_xml.convert), so
  it is constrained where that reading is exact: a standard non-string type (integer, number,
  object, array, null, a type list without "string", anyOf/oneOf) is `%json` of the parameter's
  schema ($defs carried along); boolean is true / false (either capitalization); a string's enum or
  const is the list of its values, minLength / maxLength bound the text. Any other string value is
  free text (pattern and format are not enforced). No free-text value may contain `</parameter>`
  or `</tool_call>` (the parser would end there).

Not enforced in either form: a JSON string that contains `</tool_call>` (or, in an xml value,
`</parameter>`): the parser ends the block there.

No text may come before the first call, but a thinking model may think first: when the prompt
opened `<think>` the output starts inside the block ("open"); when the chat template knows
`<think>` and the prompt did not just close one (thinking switched off), the output may open one
("optional"); after `</think>` and whitespace the calls follow. A tag the tokenizer has as a
special token is matched as that token, otherwise as text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from treeflash.engine.request import Grammar
from treeflash.server.errors import bad_request
from treeflash.server.reasoning import prompt_opens_thinking
from treeflash.server.tool_xml import STRING_TYPES, schema_type
from treeflash.server.tools import END, FORMS, START

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # llguidance x-guidance options
JSON_TYPES = ("integer", "number", "object", "array", "null", "boolean")  # standard non-string JSON schema types
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TAGS = frozenset((START, END, THINK_OPEN, THINK_CLOSE))  # the tags a grammar writes (as special tokens where the tokenizer has them)
THINK_MODES = ("none", "optional", "open")
NOT_IN_VALUE = "~/(?s:.*)(<\\/parameter>|<\\/tool_call>)(?s:.*)/"  # a terminal no xml value may match


@dataclass(frozen=True)
class ForcedChoice:
    """A forced choice: the output is tool calls, of the function `name` only when set."""

    name: str | None = None
    param: str = "tool_choice"  # the request field, for errors


@dataclass(frozen=True)
class CallFormat:
    """How this model writes calls: the parser's form, the tag texts that are special tokens, and
    whether a reasoning block may come first (THINK_MODES)."""

    form: str  # json | xml
    special: frozenset[str] = frozenset()
    think: str = "none"

    def __post_init__(self) -> None:
        if self.form not in FORMS or self.think not in THINK_MODES:
            raise ValueError(f"CallFormat: form one of {FORMS}, think one of {THINK_MODES}; got {self.form!r}, {self.think!r}")


def think_mode(template: str | None, prompt: str) -> str:
    """"open" when the prompt ends inside a <think> block; "none" when it ends right after one (a
    template that switched thinking off) or the template knows no <think>; else "optional"."""
    if prompt_opens_thinking(prompt):
        return "open"
    if prompt.rstrip().endswith(THINK_CLOSE) or template is None or THINK_OPEN not in template:
        return "none"
    return "optional"


def check_choice(choice: ForcedChoice | None, names: list[str], other: str | None, name_param: str) -> None:
    """A 400 for a forced choice the request cannot have: no tools, an unknown name (naming
    `name_param`), or another structured-output field `other` beside it."""
    if choice is None:
        return
    if not names:
        raise bad_request(f"{choice.param} forces a tool call, but the request has no tools", choice.param)
    if choice.name is not None and choice.name not in names:
        raise bad_request(f"{name_param} {choice.name!r} is not one of the request's tools ({', '.join(map(repr, names))})",
                          name_param)
    if other is not None:
        raise bad_request(f"{choice.param} forces tool calls and {other} constrains the output: send one of them", choice.param)


def tool_call_grammar(choice: ForcedChoice, tools: list[dict[str, Any]], fmt: CallFormat, max_calls: int | None = None) -> Grammar:
    """The grammar of the calls `choice` allows; `tools`: OpenAI function tools as dicts
    ({"type": "function", "function": {"name", "parameters"}})."""
    fns = [t.get("function", t) for t in tools]
    fns = [f for f in fns if choice.name is None or f["name"] == choice.name]
    rules = ["%llguidance {}"]
    lead = {"none": "", "optional": "think_block? ", "open": "think_rest "}[fmt.think]
    rules.append(f"start: {lead}call" + ("" if max_calls == 1 else ' ("\\n" call)*'))
    if fmt.think != "none":
        rules += _think_rules(fmt.special)
    newline_before_end = '"\\n" ' if fmt.form == "json" else ""  # the xml body ends with its own newline
    rules.append(f'call: {_tag(START, fmt.special)} "\\n" body {newline_before_end}{_tag(END, fmt.special)}')
    rules.append("body: " + " | ".join(f"fn_{i}" for i in range(len(fns))))
    for i, fn in enumerate(fns):
        params = fn.get("parameters") or {"type": "object"}
        rules += _json_call(i, fn["name"], params) if fmt.form == "json" else _xml_call(i, fn["name"], params)
    return Grammar("grammar", "\n".join(rules) + "\n", "tools")


def _think_rules(special: frozenset[str]) -> list[str]:
    if THINK_CLOSE in special:
        rest = [f"think_rest: THINK_TEXT {_tag(THINK_CLOSE, special)} WS?", "THINK_TEXT: /(?s:.*)/"]
    else:  # lazy: the text ends at the first </think>, which it includes
        rest = ["think_rest: think_text WS?", "think_text[lazy]: THINK_TEXT", "THINK_TEXT: /(?s:.*)<\\/think>/"]
    return [f"think_block: {_tag(THINK_OPEN, special)} think_rest", *rest, "WS: /[ \\t\\n]+/"]


def _json_call(i: int, name: str, params: dict[str, Any]) -> list[str]:
    defs = {k: params[k] for k in ("$defs", "definitions") if k in params}  # "#/$defs/X" refs resolve at the root
    if isinstance(params.get("properties"), dict) and params["properties"] and "additionalProperties" not in params:
        params = {**params, "additionalProperties": False}  # the declared parameters only (as the xml form)
    schema = {"type": "object", "properties": {"name": {"const": name}, "arguments": params},
              "required": ["name", "arguments"], "additionalProperties": False, **defs, "x-guidance": JSON_LAYOUT}
    return [f"fn_{i}: %json {json.dumps(schema, ensure_ascii=False)}"]


def _xml_call(i: int, name: str, params: dict[str, Any]) -> list[str]:
    _check_xml_name(name, "tools[].function.name")
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or ())
    defs = {k: params[k] for k in ("$defs", "definitions") if k in params}
    rules, seq = [], []
    for j, (pname, schema) in enumerate(props.items()):
        _check_xml_name(pname, f"parameters of {name!r}")
        rule = f"p_{i}_{j}"
        seq.append(rule + ("" if pname in required else "?"))
        rules += _xml_param(rule, _lit(f"<parameter={pname}>\n"), schema if isinstance(schema, dict) else {}, defs)
    if not props and params.get("additionalProperties") is not False:  # any names, free text
        seq.append(f"p_{i}_any*")
        rules += [f'p_{i}_any: "<parameter=" PNAME ">\\n" free_{i}', "PNAME: /[^>\\n]+/",
                  f"free_{i}[lazy]: FREE_{i}", f"FREE_{i}: (/(?s:.*)/ & {NOT_IN_VALUE}) \"\\n</parameter>\\n\""]
    body = " ".join(seq)
    return [f"fn_{i}: {_lit(f'<function={name}>' + chr(10))} {body} \"</function>\\n\"", *rules]


def _xml_param(rule: str, head: str, schema: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """One parameter: `head` then its value then the closing tag, by how tool_xml.convert reads it."""
    close = '"\\n</parameter>\\n"'
    types = schema.get("type")
    type_list = types if isinstance(types, list) else [types] if isinstance(types, str) else []
    parsed = schema_type(schema)
    if parsed in STRING_TYPES:
        values = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
            return [f"{rule}: {head} ({' | '.join(_lit(v) for v in values)}) {close}"]
        lo, hi = (schema.get(k) if isinstance(schema.get(k), int) else None for k in ("minLength", "maxLength"))
        bound = f"{{{lo or 0},{'' if hi is None else hi}}}"
        term = rule.upper()
        return [f"{rule}: {head} v_{rule}", f"v_{rule}[lazy]: {term}",
                f"{term}: (/(?s:.){bound}/ & {NOT_IN_VALUE}) {close}"]
    if parsed == "boolean" and all(t in ("boolean", "null") for t in type_list):
        words = ["true", "false", "True", "False"] + (["null"] if "null" in type_list else [])
        return [f"{rule}: {head} ({' | '.join(_lit(w) for w in words)}) {close}"]
    standard = all(t in JSON_TYPES for t in type_list) if type_list else any(k in schema for k in ("anyOf", "oneOf", "properties"))
    if not standard:  # a type the parser reads its own way (int, float, enum, ...): free text
        term = rule.upper()
        return [f"{rule}: {head} v_{rule}", f"v_{rule}[lazy]: {term}", f"{term}: (/(?s:.*)/ & {NOT_IN_VALUE}) {close}"]
    sub = {**schema, **({k: v for k, v in defs.items() if k not in schema} if "$ref" in json.dumps(schema) else {}),
           "x-guidance": JSON_LAYOUT}
    return [f"{rule}: {head} v_{rule} {close}", f"v_{rule}: %json {json.dumps(sub, ensure_ascii=False)}"]


def _check_xml_name(name: str, where: str) -> None:
    if not name or ">" in name or "\n" in name or name != name.strip():
        raise bad_request(f"{where}: {name!r} cannot be written in the XML tool-call form (no '>', newline or "
                          "surrounding space)", "tools")


def _tag(text: str, special: frozenset[str]) -> str:
    """A tag as a grammar item: the special token of that text, or the text."""
    return text if text in special else _lit(text)  # llguidance's special-token syntax is the token's text


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
