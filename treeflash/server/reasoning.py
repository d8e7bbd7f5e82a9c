"""Reasoning split: text inside `<think>...</think>` goes to `reasoning_content`, the rest to `content`.

Works on a text stream. The output is reasoning when it opens with `<think>`, or when the prompt
already opened the block (Qwen3.5/3.6 templates end the prompt with `<think>\\n` when thinking is
on). An unclosed block at the end (the model ran out of max_tokens while thinking) is all
reasoning. Whitespace right after `</think>` is dropped: the model writes it as layout.
"""

from __future__ import annotations

from treeflash.server.tools import partial_tail

OPEN, CLOSE = "<think>", "</think>"


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an open `<think>` block."""
    tail = prompt.rstrip()
    return tail.endswith(OPEN)


class ReasoningSplitter:
    def __init__(self, in_think: bool = False):
        # "start": nothing decided yet; "think": inside the block; "after": just closed; "content": plain text
        self.state = "think" if in_think else "start"
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        """Returns (reasoning, content) that are safe to emit."""
        self.buf += text
        reasoning, content = [], []
        while self.buf:
            if self.state == "start":
                head = self.buf.lstrip()
                if head.startswith(OPEN):
                    self.buf, self.state = head[len(OPEN):], "think"
                    continue
                if OPEN.startswith(head):  # whitespace or a partial tag: wait
                    break
                self.state = "content"
            elif self.state == "think":
                end = self.buf.find(CLOSE)
                if end >= 0:
                    reasoning.append(self.buf[:end])
                    self.buf, self.state = self.buf[end + len(CLOSE):], "after"
                    continue
                keep = partial_tail(self.buf, CLOSE)
                reasoning.append(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            elif self.state == "after":
                self.buf = self.buf.lstrip()
                if self.buf:
                    self.state = "content"
            else:
                content.append(self.buf)
                self.buf = ""
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        if self.state == "think":
            return rest, ""
        if self.state == "after":
            return "", ""
        return "", rest


def split_reasoning(text: str, in_think: bool = False) -> tuple[str, str]:
    """The whole text at once: (reasoning, content)."""
    s = ReasoningSplitter(in_think)
    r1, c1 = s.feed(text)
    r2, c2 = s.flush()
    return r1 + r2, c1 + c2
