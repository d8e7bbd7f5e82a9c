"""Incremental detokenization: turn a growing token list into text deltas without breaking
multi-byte characters (a token may end in the middle of a UTF-8 sequence).

Each delta is decode(ids[prefix:]) minus decode(ids[prefix:read]): decoding with a few tokens of
context keeps leading-space handling identical to decoding the whole text at once.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int] | tuple[int, ...] = ()):
        self.tok = tokenizer
        self.ids: list[int] = list(prompt_ids[-6:])
        self.prefix = 0  # ids[prefix:read]: context already emitted
        self.read = len(self.ids)

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        before = self.tok.decode(self.ids[self.prefix : self.read], skip_special_tokens=False)
        after = self.tok.decode(self.ids[self.prefix :], skip_special_tokens=False)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # an incomplete character: wait for the next tokens
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a trailing incomplete character) at the end of a stream."""
        before = self.tok.decode(self.ids[self.prefix : self.read], skip_special_tokens=False)
        after = self.tok.decode(self.ids[self.prefix :], skip_special_tokens=False)
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""
