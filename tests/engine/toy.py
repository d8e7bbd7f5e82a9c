"""A toy tokenizer and LoadedModel stand-in over a random tiny model, for engine tests."""

from __future__ import annotations

from dataclasses import dataclass

from tests.models.hf_oracle import make_pair

ALPHABET = [chr(ord("a") + i) for i in range(26)] + [" ", "\n", ".", ",", "é", "ü"]


class ToyTokenizer:
    """Token i is ALPHABET[i % len(ALPHABET)] (so words come out of random models)."""

    eos_token_id = 96

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ALPHABET.index(c) if c in ALPHABET else 0 for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(ALPHABET[i % len(ALPHABET)] for i in ids)


@dataclass
class ToyLoaded:
    model: object
    tokenizer: object
    config: object
    chat_template: str | None = None
    source: str = "toy"


def toy_loaded(arch: str = "qwen3") -> ToyLoaded:
    _, model = make_pair(arch)
    return ToyLoaded(model, ToyTokenizer(), model.config)
