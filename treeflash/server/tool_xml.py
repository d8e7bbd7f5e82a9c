"""The XML tool-call form of Qwen3-Coder, Qwen3.5 and Qwen3.6 (vLLM calls its parser qwen3_coder):

    <tool_call>
    <function=NAME>
    <parameter=P>
    value, possibly over several lines
    </parameter>
    </function>
    </tool_call>

Values are text, so each is converted by the tool's JSON schema, as vLLM's qwen3_coder parser does:
a `string` parameter stays the text as written; integer / number / boolean parse the text (and keep
it as a string when it does not parse); object, array and anything else are read as JSON (kept as
a string when not JSON; never evaluated as Python); `null` text is None for a non-string type. A
parameter the schema does not know stays a string. The newline the template puts after the
opening tag and before the closing one is layout, not value.
"""

from __future__ import annotations

import json
import re
from typing import Any

FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
INTEGER_TYPES = ("integer", "int", "uint", "long", "short")
NUMBER_TYPES = ("number", "float", "double", "decimal")
BOOLEAN_TYPES = ("boolean", "bool", "binary")


def parameter_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, str]]:
    """OpenAI tool definitions -> {function name: {parameter: JSON schema type}} (types lower-cased)."""
    out: dict[str, dict[str, str]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(props, dict):
            out[fn["name"]] = {p: schema_type(s) for p, s in props.items() if isinstance(s, dict)}
    return out


def schema_type(schema: dict[str, Any]) -> str:
    t = schema.get("type")
    if isinstance(t, list):  # ["integer", "null"]: the first non-null type decides
        t = next((x for x in t if x != "null"), "string")
    if t is None and ("anyOf" in schema or "oneOf" in schema or "properties" in schema):
        t = "object"
    return str(t or "string").lower()


def convert(value: str, type_name: str | None) -> Any:
    """One parameter's text -> its JSON value, by the schema type (None: not in the schema)."""
    if type_name is None or type_name in STRING_TYPES:
        return value
    if value.strip().lower() == "null":
        return None
    text = value.strip()
    try:
        if type_name in INTEGER_TYPES:
            return int(text)
        if type_name in NUMBER_TYPES:
            number = float(text)
            return int(number) if number.is_integer() and re.fullmatch(r"-?\d+", text) else number
    except ValueError:
        return value
    if type_name in BOOLEAN_TYPES:
        return text.lower() == "true" if text.lower() in ("true", "false") else value
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return value


def parse_xml_block(body: str, types: dict[str, dict[str, str]]) -> tuple[str, dict[str, Any]] | None:
    """The text between <tool_call> and </tool_call> -> (name, arguments), or None if it is not one
    call in the XML form (anything but whitespace outside the parameters makes it malformed)."""
    m = FUNCTION.match(body)
    if m is None:
        return None
    name, inner = m.group(1).strip(), m.group(2)
    if not name:
        return None
    schema = types.get(name, {})
    args: dict[str, Any] = {}
    last = 0
    for p in PARAMETER.finditer(inner):
        if inner[last:p.start()].strip():
            return None
        key, value = p.group(1).strip(), p.group(2)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        args[key] = convert(value, schema.get(key))
        last = p.end()
    if inner[last:].strip():
        return None
    return name, args
