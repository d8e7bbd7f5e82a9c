"""Stop strings over a text stream: emit text as soon as it cannot be the start of a stop string,
and cut exactly before the first stop string, even when it spans several deltas."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.held = ""  # text that might still begin a stop string
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.matched: str | None = None  # the stop string that ended the text (Anthropic reports it)

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped)."""
        if not self.stops:
            return text, False
        buf = self.held + text
        found = [(i, s) for s, i in ((s, buf.find(s)) for s in self.stops) if i >= 0]
        if found:
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
