"""Stored responses of /v1/responses: what `store: true` keeps so that GET, DELETE, cancel and
`previous_response_id` find a response again.

- Bounded: at most `--max-stored-responses` entries; storing past the bound evicts the least recently
  used one (reading, chaining from or storing an entry uses it). An entry whose background run is
  still going is never evicted; it is bounded by the queue cap instead.
- Kept per owner: when the server has an API key, the owner is the digest of the key a request
  presented, so a response is found only with the key that made it; without keys there is one owner.
- An entry holds its own turn only (its input items, its response) and the id of the previous
  response; a conversation is walked back link by link, each link used (so an ongoing conversation
  keeps its earlier turns), never copied into every turn.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from radixgen.runtime.server.protocol import APIError, bad_request
from radixgen.runtime.server.responses_input import as_input
from radixgen.runtime.server.responses_protocol import InputItem, ResponseObject

CHAINABLE = ("completed", "incomplete")  # statuses a previous_response_id may name


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id {response_id!r} not found.", "invalid_request_error", param,
                    "response_not_found")


@dataclass
class StoredResponse:
    """One stored turn: its response as it stands, its own input items, and its background run."""

    response: ResponseObject
    input: list[InputItem]
    task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


class ResponseStore:
    """A bounded LRU of stored responses per owner (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, entry: StoredResponse) -> None:
        key = (owner, entry.response.id)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        excess = len(self._entries) - self.capacity
        if excess > 0:
            idle = [k for k, e in self._entries.items() if not e.running][:excess]
            for k in idle:
                del self._entries[k]

    def get(self, owner: str, response_id: str, param: str | None = None) -> StoredResponse:
        """The entry (now the most recently used); 404 in OpenAI's shape if this owner has none."""
        key = (owner, response_id)
        entry = self._entries.get(key)
        if entry is None:
            raise not_found(response_id, param)
        self._entries.move_to_end(key)
        return entry

    def pop(self, owner: str, response_id: str) -> StoredResponse:
        entry = self._entries.pop((owner, response_id), None)
        if entry is None:
            raise not_found(response_id)
        return entry

    def conversation(self, owner: str, response_id: str) -> list[InputItem]:
        """The items of the conversation ending with response `response_id`, oldest first: each turn's
        input items, then its output as items. 404 if a link is gone, 400 if one did not finish."""
        chain: list[StoredResponse] = []
        link: str | None = response_id
        while link is not None:
            entry = self.get(owner, link, "previous_response_id")
            status = entry.response.status
            if status not in CHAINABLE:
                raise bad_request(f"Response {link!r} is {status}: a conversation continues only from a "
                                  f"response that is {' or '.join(CHAINABLE)}", "previous_response_id")
            chain.append(entry)
            link = entry.response.previous_response_id
        items: list[InputItem] = []
        for entry in reversed(chain):
            items += entry.input
            items += [as_input(item) for item in entry.response.output]
        return items
