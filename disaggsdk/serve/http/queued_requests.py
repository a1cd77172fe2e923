"""A bound on the requests waiting for their first token: past ``$.serve.max_queued_requests``, a
newcomer gets 503 with ``Retry-After`` at once instead of a first token minutes later.

Without it the queue has no end (a first token after minutes), and a client cannot
tell a slow server from a dead one. A request counts from the moment it is handed to the backend
until its first token (or its failure): that is the time it queues, for a free decode slot or for
the prefill ahead of it. One HTTP request counts once, whatever its ``n`` or number of prompts.
SGLang calls the same bound ``--max-queued-requests`` and answers it with 503 too.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.responses import JSONResponse

from disaggsdk.serve.http.error_bodies import error_response

# a full queue drains at the rate first tokens come, well under a second to a few seconds; clients
# (openai-python among them) back off further on each repeat
RETRY_AFTER_S = 1


class QueuedRequests:
    """The requests of this front end that wait for their first token (one event loop: no lock).

    Args:
        max_queued_requests: how many may wait at once.
    """

    def __init__(self, max_queued_requests: int):
        self.max_queued_requests = max_queued_requests
        self.num_queued = 0

    def enter(self) -> Callable[[], None] | None:
        """Count a request in, or None when the queue is full (answer it with `full_response`).

        Returns:
            what counts it out once its first token came or it failed (call it once).
        """
        if self.num_queued >= self.max_queued_requests:
            return None
        self.num_queued += 1

        def leave() -> None:
            self.num_queued -= 1

        return leave

    def full_response(self) -> JSONResponse:
        """The 503 a request meets while the queue is full: an OpenAI error object and ``Retry-After``."""
        return error_response(503, f"the server is busy: {self.num_queued} requests wait for their first token "
                                   f"(serve.max_queued_requests); retry after {RETRY_AFTER_S} s",
                              headers={"Retry-After": str(RETRY_AFTER_S)})
