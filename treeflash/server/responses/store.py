"""The responses kept for `previous_response_id`: a bounded in-memory LRU of conversations.

Each entry is the whole conversation as input items (what came before, this turn's input, this
turn's output), so continuing from a response is its items followed by the new input. Nothing
goes to disk; a restart forgets everything. Entries are bounded in number (`--responses-store`);
each is bounded by the request body limit and the context, so memory is too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from treeflash.server.errors import bad_request
from treeflash.server.responses.protocol import Item


class ResponseStore:
    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._items: OrderedDict[str, list[Item]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, items: list[Item]) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            self._items[response_id] = items
            self._items.move_to_end(response_id)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def conversation(self, response_id: str) -> list[Item]:
        """The stored items, or a 400 that says why there are none."""
        with self._lock:
            items = self._items.get(response_id)
            if items is not None:
                self._items.move_to_end(response_id)
                return list(items)
        kept = (f"it keeps the last {self.max_entries} stored responses in memory (--responses-store)" if self.max_entries
                else "it keeps none (--responses-store 0)")
        raise bad_request(f"previous_response_id {response_id[:80]!r} is not kept by this server: {kept}; send the whole "
                          "conversation as input instead", "previous_response_id")
