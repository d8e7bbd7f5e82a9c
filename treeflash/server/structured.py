"""Structured-output fields of every wire format -> the engine's Grammar, or a 400 naming the field.

OpenAI chat/completions: `response_format` {"type": "text" | "json_object" | "json_schema",
"json_schema": {"name", "schema", "strict", "description"}}. vLLM's `structured_outputs` {"json" |
"regex" | "choice" | "grammar" | "json_object"} and the legacy `guided_json` / `guided_regex` /
`guided_choice` / `guided_grammar`. OpenAI Responses: `text.format` {"type": "json_schema", "name",
"schema", "strict"} or {"type": "json_object"}. Anthropic Messages: `output_config.format`
{"type": "json_schema", "schema"}. At most one of them per request; anything this server does not
do (a structural tag, a whitespace pattern, another backend) is refused by name, never ignored.
The grammar itself is checked against the tokenizer later (Frontend.check_grammar: llguidance's
own validation, so an unsupported schema keyword is a 400 too).
"""

from __future__ import annotations

import json
from typing import Any

from treeflash.engine.request import Grammar
from treeflash.server.errors import bad_request

ANY_OBJECT = json.dumps({"type": "object"})  # OpenAI's json_object: any JSON object
VLLM_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
BACKENDS = (None, "auto", "guidance", "llguidance")  # guided_decoding_backend / structured_outputs backend names accepted


def openai_format(fmt: Any, param: str = "response_format", flat: bool = False) -> Grammar | None:
    """response_format (chat, completions), or text.format (Responses: flat=True, the json_schema
    fields sit beside `type`)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad_request(f"{param} must be an object with a string type", param)
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_schema", ANY_OBJECT, param)
    if kind != "json_schema":
        raise bad_request(f"{param}.type {kind!r} is not supported; use text, json_object or json_schema", f"{param}.type")
    where = param if flat else f"{param}.json_schema"
    spec = fmt if flat else fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request(f"{where} must be an object with name and schema", where)
    if not isinstance(spec.get("name", ""), str) or (not flat and "name" not in spec):
        raise bad_request(f"{where}.name must be a string", f"{where}.name")
    if spec.get("strict") not in (None, True, False):
        raise bad_request(f"{where}.strict must be a boolean", f"{where}.strict")
    return Grammar("json_schema", _schema_text(spec.get("schema"), f"{where}.schema"), f"{where}.schema")


def anthropic_format(fmt: Any, param: str = "output_config.format") -> Grammar | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise bad_request(f"{param} must be {{'type': 'json_schema', 'schema': {{...}}}}", param)
    return Grammar("json_schema", _schema_text(fmt.get("schema"), f"{param}.schema"), f"{param}.schema")


def vllm_fields(structured_outputs: Any, guided: dict[str, Any]) -> Grammar | None:
    """vLLM's structured_outputs object and the legacy guided_* fields (guided: name -> value, None when absent)."""
    found: list[Grammar] = []
    if structured_outputs is not None:
        if not isinstance(structured_outputs, dict):
            raise bad_request("structured_outputs must be an object", "structured_outputs")
        for key, value in structured_outputs.items():
            if value is None or (key == "json_object" and value is False):
                continue
            where = f"structured_outputs.{key}"
            if key == "backend":
                _check_backend(value, where)
            elif key == "json_object":
                if value is not True:
                    raise bad_request(f"{where} must be a boolean", where)
                found.append(Grammar("json_schema", ANY_OBJECT, where))
            elif key in VLLM_KINDS:
                found.append(_vllm_grammar(key, value, where))
            else:
                raise bad_request(f"{where} is not supported (json, regex, choice, grammar and json_object are)", where)
    for name, value in guided.items():
        if value is None:
            continue
        if name == "guided_decoding_backend":
            _check_backend(value, name)
        elif name in GUIDED:
            found.append(_vllm_grammar(GUIDED[name], value, name))
        else:
            raise bad_request(f"{name} is not supported", name)
    return only_one(found)


def only_one(grammars: list[Grammar | None]) -> Grammar | None:
    given = [g for g in grammars if g is not None]
    if len(given) > 1:
        raise bad_request(f"send one structured-output constraint, got {len(given)}: {', '.join(g.param for g in given)}",
                          given[1].param)
    return given[0] if given else None


def _vllm_grammar(key: str, value: Any, where: str) -> Grammar:
    if key == "json":
        return Grammar("json_schema", _schema_text(value, where), where)
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"{where} must be a non-empty list of non-empty strings", where)
        return Grammar("choice", json.dumps(value), where)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where} must be a non-empty string", where)
    return Grammar(VLLM_KINDS[key], value, where)


def _schema_text(schema: Any, where: str) -> str:
    """A JSON schema given as an object (or, vLLM-style, as JSON text) -> its JSON text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise bad_request(f"{where} is not valid JSON: {e}", where) from None
    if isinstance(schema, bool):
        schema = {} if schema else None
    if not isinstance(schema, dict):
        raise bad_request(f"{where} must be a JSON schema object", where)
    return json.dumps(schema)


def _check_backend(value: Any, where: str) -> None:
    if value not in BACKENDS:
        raise bad_request(f"{where} {value!r} is not offered: this server constrains with llguidance ('guidance')", where)
