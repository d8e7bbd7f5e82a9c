"""The tokenizer bridge for grammars: the exact bytes of every token id, from our own tokenizer.

llguidance's `from_tokenizer` reads a tokenizer.json and recognizes a byte-level BPE by its decoder;
the tokenizers transformers builds from a GGUF vocabulary chain several decoders (ByteFallback, Fuse,
Replace, ByteLevel), which it takes for a plain vocabulary, so every space became the two bytes of
"Ġ" and a JSON schema could never emit one. So the bytes are computed here and handed over through
llguidance's TokenizerWrapper protocol (tokens, eos/bos ids, special ids, an encode callable):

- byte-level BPE (GPT-2, SmolLM2, Qwen): each character of a token stands for one byte (the GPT-2
  table of 256 printable characters);
- SentencePiece-style vocabularies: "<0xNN>" is byte NN, "▁" is a space, the rest is UTF-8;
- added tokens are their text; special (control) tokens are listed as special, so a grammar
  matches them only by name, never as text; ids past the tokenizer's own vocabulary (an lm_head
  padded to a round size) are empty specials, never allowed.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def gpt2_byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable character -> the byte it stands for."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def is_byte_level(backend_json: dict[str, Any]) -> bool:
    """Whether the tokenizer's pre-tokenizer or decoder contains a ByteLevel step."""

    def has(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has(v) for v in node.values())
        if isinstance(node, list):
            return any(has(v) for v in node)
        return False

    return has(backend_json.get("pre_tokenizer")) or has(backend_json.get("decoder"))


def token_bytes(tokenizer, vocab_size: int, eos_ids: list[int]) -> tuple[list[bytes], list[int]]:
    """(bytes of ids 0..vocab_size-1, the special ids) for a transformers fast tokenizer; a tokenizer
    without a tokenizers backend (a character-level test tokenizer) gets each id's decoded text. The
    end-of-sequence ids are special either way."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        out = [tokenizer.decode([i]).encode("utf-8") for i in range(vocab_size)]
        return out, sorted({i for i in eos_ids if 0 <= i < vocab_size})
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=False)
    added = {int(i): t for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
    byte_level = is_byte_level(json.loads(backend.to_str()))
    decoder = gpt2_byte_decoder() if byte_level else {}
    out: list[bytes] = [b""] * vocab_size
    known = [False] * vocab_size
    for text, i in vocab.items():
        if 0 <= i < vocab_size:
            out[i] = _piece_bytes(text, decoder) if byte_level else _sentencepiece_bytes(text)
            known[i] = True
    special = []
    for i, tok in added.items():
        if 0 <= i < vocab_size:
            out[i] = tok.content.encode("utf-8")
            known[i] = True
            if tok.special:
                special.append(i)
    special.extend(i for i in range(vocab_size) if not known[i])  # padding ids: empty, never allowed
    special.extend(i for i in eos_ids if 0 <= i < vocab_size)
    return out, sorted(set(special))


def _piece_bytes(text: str, decoder: dict[str, int]) -> bytes:
    if all(c in decoder for c in text):
        return bytes(decoder[c] for c in text)
    return text.encode("utf-8")  # not a byte-level piece (an added token kept in the model's vocabulary)


def _sentencepiece_bytes(text: str) -> bytes:
    m = _BYTE_TOKEN.match(text)
    if m:
        return bytes([int(m.group(1), 16)])
    return text.replace("▁", " ").encode("utf-8")


class TokenizerBridge:
    """What llguidance's TokenizerWrapper reads (its duck-typed protocol): tokens, eos/bos ids,
    special ids, and an encode callable. Encoding uses a tokenizer of its own under a lock: a Rust
    tokenizer must not run in two threads at once."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int]):
        import copy

        self.tokens, self.special_token_ids = token_bytes(tokenizer, vocab_size, eos_ids)
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self._tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("the bridge encodes str")  # TokenizerWrapper then passes str
        with self._lock:
            if getattr(self._tokenizer, "backend_tokenizer", None) is None:
                return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])
            return list(self._tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
