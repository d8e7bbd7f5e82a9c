"""Stop strings over a text stream: emit text as soon as it cannot be the start of a stop string,
and cut exactly before the first stop string, even when it spans several deltas.

Text fed with armed=False (the tokens before min_tokens, as vLLM) is never cut: a stop string
counts only where its match ends in armed text."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.held = ""  # text that might still begin a stop string
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.matched: str | None = None  # the stop string that ended the text (Anthropic reports it)

    def feed(self, text: str, armed: bool = True) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped)."""
        if not self.stops:
            return text, False
        buf = self.held + text
        # a match must end inside `text`: held text holds none that ended in armed text, and one that
        # ended in unarmed text does not count
        found = [(i, s) for s, i in ((s, buf.find(s, max(0, len(self.held) - len(s) + 1))) for s in self.stops) if i >= 0]
        if found and armed:
            cut, self.matched = min(found, key=lambda f: f[0])
            self.held = ""
            return buf[:cut], True
        keep = 0
        for k in range(min(self.hold, len(buf)), 0, -1):  # longest tail that is a prefix of a stop string
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                keep = k
                break
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
