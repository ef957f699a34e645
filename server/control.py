"""``/control``: the staleness policy changed while the run trains, kept on disk.

``GET /control`` answers the policy in force and its changes. ``POST /control`` (JSON
``{"staleness": "<policy>"}``; who may send it: server/http.py) puts the policy in force
from the next step, tells the workers (server/staleness.py), and answers 200 with the
record of the change only once a checkpoint holding it is on disk (taken at the next
moment between steps: server/checkpointer.py's ``write_now``). Before, a change was
checkpointed with whatever came next (a step, an epoch end): one made before the run's
first step, or while no worker trained, was in no checkpoint, and a server killed then
restarted under the old policy without a word.

When that checkpoint cannot be written (a full disk), the change is taken back at once
(a change of its own, ``by`` the server, told to the workers and traced like any), and
the answer is 503 saying why and which policy stays in force: a client is never told
"done" for a change a crash would undo. Changes are made one at a time, so the policy
taken back to is the one in force before that change.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING

from aiohttp import web

from snet.protocol.errors import ConfigError

from .security import is_loopback

if TYPE_CHECKING:
    from .app import SnetServer

log = logging.getLogger("snet.server")

CONTROL_BODY_BYTES = 4096  # a control request is a few words of JSON
TAKEN_BACK_BY = "the server: the change's checkpoint was not written"


class Control:
    """The ``/control`` endpoint of one server (``token_required``: the bearer middleware
    checked the token; without one, changes come from loopback only)."""

    def __init__(self, server: SnetServer, token_required: bool) -> None:
        self.server = server
        self.token_required = token_required
        self._changing = asyncio.Lock()  # one change at a time: see the module docstring

    async def state(self, request: web.Request) -> web.Response:
        """``GET /control``: the policy in force and its changes."""
        return web.json_response(self.server.coordinator.staleness.figures())

    async def change(self, request: web.Request) -> web.Response:
        """``POST /control``: another staleness policy, answered once it is on disk."""
        text = await self._policy_asked(request)
        async with self._changing:
            coordinator = self.server.coordinator
            if coordinator.finished.is_set():  # it was accepted, logged and checkpointed
                raise web.HTTPConflict(text="the run has ended (trained): nothing to change\n")
            try:
                record = coordinator.set_staleness(text, by=request.remote or "?")
            except ConfigError as exc:
                raise web.HTTPBadRequest(text=f"{exc}\n") from None
            checkpointer = self.server.checkpointer
            if checkpointer is not None and not record.get("unchanged"):  # None: not started
                try:
                    await checkpointer.write_now()
                except OSError as exc:
                    coordinator.set_staleness(record["from"], by=TAKEN_BACK_BY)
                    log.error("staleness policy %s taken back (%s): %s stays in force",
                              record["to"], exc, record["from"])  # fmt: skip
                    raise web.HTTPServiceUnavailable(
                        text=f"staleness policy not changed: {exc}; {record['from']} stays "
                        "in force\n"
                    ) from None
        return web.json_response(record)

    async def _policy_asked(self, request: web.Request) -> str:
        """The policy a request asks for; its refusal (403, 400, 408) if it may not."""
        if not self.token_required and not is_loopback(request.remote or ""):
            raise web.HTTPForbidden(text="control from loopback only (the server has no token)\n")
        try:  # a body sent slowly is held to the same bound as the headers (http_guard.py)
            async with asyncio.timeout(self.server.config.http_header_seconds):
                body = json.loads(await _bounded_body(request))
        except TimeoutError:
            timed_out = web.HTTPRequestTimeout(text="the request body took too long\n")
            timed_out.force_close()  # not held open for its next request's wait as well
            raise timed_out from None
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"the body is not JSON: {exc}\n") from None
        except RecursionError:  # json's decoder recurses per level of nesting
            raise web.HTTPBadRequest(text="the body is JSON nested too deeply\n") from None
        if (
            not isinstance(body, dict)
            or set(body) != {"staleness"}
            or not isinstance(body["staleness"], str)
        ):
            raise web.HTTPBadRequest(text='expected {"staleness": "<policy>"}\n')
        return body["staleness"]


async def _bounded_body(request: web.Request) -> bytes:
    """The request's body, CONTROL_BODY_BYTES at most (400 past them), read as it comes: a
    chunked one, whose length is not said first, was refused as if it were too long."""
    too_long = web.HTTPBadRequest(text=f"a JSON body of at most {CONTROL_BODY_BYTES} bytes\n")
    if request.content_length is not None and request.content_length > CONTROL_BODY_BYTES:
        raise too_long
    body = bytearray()
    while chunk := await request.content.read(CONTROL_BODY_BYTES + 1 - len(body)):
        body += chunk
        if len(body) > CONTROL_BODY_BYTES:
            raise too_long
    return bytes(body)
