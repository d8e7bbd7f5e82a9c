"""Twenty JSON schemas with a prompt each, for structured outputs on the default model: objects, arrays,
enums, nesting, numbers with bounds, patterns, optional fields, unions and references."""

from __future__ import annotations

OBJ = {"type": "object", "additionalProperties": False}


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {**OBJ, "properties": props, "required": list(props) if required is None else required}


SCHEMAS: list[tuple[str, dict]] = [
    ("Describe a person named Alice who is 30.", obj({"name": {"type": "string"}, "age": {"type": "integer"}})),
    ("Is the sky blue? Answer as JSON.", obj({"answer": {"type": "boolean"}})),
    ("Give the capital of France.", obj({"country": {"type": "string"}, "capital": {"type": "string"}})),
    ("List three fruits.", obj({"fruits": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3}})),
    ("Rate the movie Up from 1 to 5.", obj({"movie": {"type": "string"}, "stars": {"type": "integer", "minimum": 1, "maximum": 5}})),
    ("What color is grass?", obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("Give a point in 2D.", obj({"x": {"type": "number"}, "y": {"type": "number"}})),
    ("Describe a book.", obj({"title": {"type": "string"}, "author": obj({"first": {"type": "string"}, "last": {"type": "string"}})})),
    ("Give a US zip code for New York.", obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}})),
    ("Name a programming language and its year.", obj({"language": {"type": "string", "maxLength": 20},
                                                       "year": {"type": "integer", "minimum": 1950, "maximum": 2030}})),
    ("Give a todo item.", obj({"task": {"type": "string"}, "done": {"type": "boolean"}, "priority": {"enum": [1, 2, 3]}})),
    ("List two colors with hex codes.", obj({"colors": {"type": "array", "minItems": 2, "maxItems": 2,
                                                        "items": obj({"name": {"type": "string"},
                                                                      "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}})}})),
    ("Give a temperature reading.", obj({"celsius": {"type": "number", "minimum": -50, "maximum": 60}, "city": {"type": "string"}})),
    ("Describe a pet, optionally with its age.", obj({"kind": {"type": "string"}, "age": {"type": "integer"}}, ["kind"])),
    ("Give an id that is a number or a string.", obj({"id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 16}]}})),
    ("Return an array of two numbers.", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}),
    ("Give an email contact.", obj({"name": {"type": "string"}, "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"}})),
    ("Describe an address.", {"$defs": {"street": obj({"number": {"type": "integer"}, "name": {"type": "string"}})},
                              **obj({"street": {"$ref": "#/$defs/street"}, "city": {"type": "string"}})}),
    ("Give a yes or no with a reason.", obj({"verdict": {"enum": ["yes", "no"]}, "reason": {"type": "string", "maxLength": 60}})),
    ("Describe the weather with tags.", obj({"summary": {"type": "string", "maxLength": 40},
                                             "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}})),
]
