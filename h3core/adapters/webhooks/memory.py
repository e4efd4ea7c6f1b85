"""`MemoryTransport`: a fake webhook transport that honours the contract with no network, as
httpx's `MockTransport` does for a client.

Every post is checked as the real transport checks it (`outgoing`: an IP address, an http(s) URL,
no `host` or `content-length` of the caller's), recorded as it would go on the wire, and answered
from a script: the statuses (or `PostFailed`: no answer) queued with `answer`, in order, then
`handler`'s answer, then 204. For tests of what is built on the sender, and a second
implementation beside `HttpPostClient` that the shipped contract tests run against.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from h3core.adapters.webhooks.base import Outgoing, PostFailed, outgoing

__all__ = ["MemoryTransport"]

Answer = int | PostFailed  # a status, or no answer


class MemoryTransport:
    """Records every post (`requests`, in order) and answers it from its script (see the module).
    `answers`: the first posts' answers; `handler`: the answer to a post past them (a status, or
    raise `PostFailed`), 204 without one."""

    def __init__(self, *answers: Answer, handler: Callable[[Outgoing], int] | None = None) -> None:
        self.requests: list[Outgoing] = []
        self.handler = handler
        self.closed = 0  # how many times `aclose` was called
        self._script: deque[Answer] = deque(answers)

    def answer(self, *answers: Answer) -> None:
        """Queue the answers of the next posts, after those queued before."""
        self._script.extend(answers)

    async def post(self, url: str, headers: Sequence[tuple[str, str]], body: bytes, *, address: str) -> int:
        """Record the post as it would go out and answer it from the script; `PostFailed` for no
        answer, `ValueError` for what the contract refuses (nothing recorded then)."""
        request = outgoing(url, headers, body, address)
        self.requests.append(request)
        answer = self._script.popleft() if self._script else self.handler(request) if self.handler else 204
        if isinstance(answer, PostFailed):
            raise answer
        return answer

    async def aclose(self) -> None:
        """Nothing is kept to release; counted, for tests that the sender closes its transport."""
        self.closed += 1
