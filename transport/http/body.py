"""What an HTTP request body may be, enforced before any route runs (ASGI middleware).

Every route that takes a body takes JSON (docs/api.md, "Bodies, auth and prompts"). `BodyPolicy` applies
one rule to every POST, PUT and PATCH, whatever the route:

- a body over `max_bytes` is refused with 413, however it is sent: a declared
  Content-Length over the limit before reading, a body without one (chunked
  transfer coding, RFC 9112 7.1) as soon as it passes the limit, so memory
  stays bounded;
- a Content-Type other than `application/json` (parameters such as
  `charset=utf-8` allowed; RFC 8259 11 defines no other) is refused with 415,
  even with an empty body;
- a non-empty body without a Content-Type is refused with 415 (RFC 9110 8.3
  lets a recipient guess the type; we do not);
- an empty body without a Content-Type means *no body*: `POST /v1/sessions`
  then creates a session with every default (`curl -X POST` works); routes
  that need a body answer 422 naming it.

A route may widen both (`route_policy`): `POST /v1/sessions` also takes
`multipart/form-data` (a starting image as a file part), up to the served
model's largest image in base64; WHEP (`/v1/sessions/{id}/whep...`) takes
`application/sdp` (and, so that its PATCH is answered 405, trickle-ICE
fragments) instead of JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

#: Methods whose body the policy checks.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: The one media type accepted.
JSON_TYPE = "application/json"


def media_type(content_type: bytes | None) -> str | None:
    """The media type of a Content-Type header value, lower-cased, without parameters (None: no header)."""
    if content_type is None:
        return None
    return content_type.split(b";", 1)[0].strip().lower().decode("latin-1")


@dataclass(frozen=True)
class RoutePolicy:
    """A route's own body rule: its size limit and the media types it takes besides JSON."""

    max_bytes: int  #: largest body, bytes
    extra_types: frozenset[str] = frozenset()  #: media types accepted besides application/json
    json: bool = True  #: whether application/json is accepted too

    @property
    def accepted(self) -> list[str]:
        """The media types accepted, JSON first."""
        return ([JSON_TYPE] if self.json else []) + sorted(self.extra_types)


class BodyPolicy:
    """ASGI middleware: 413 for bodies over `max_bytes`, 415 for bodies that are not JSON (see the module).

    Args:
        app: the ASGI app.
        max_bytes: largest request body, bytes.
        route_policy: scope -> the route's own `RoutePolicy` (None: the default rule).
    """

    def __init__(self, app: Any, *, max_bytes: int,
                 route_policy: Callable[[Any], RoutePolicy | None] | None = None) -> None:
        self.app, self.max_bytes, self.route_policy = app, max_bytes, route_policy

    @staticmethod
    async def _refuse(send: Any, status: int, detail: str) -> None:
        await JSONResponse({"detail": detail}, status_code=status)({"type": "http"}, None, send)  # type: ignore[arg-type]

    async def _too_large(self, send: Any, limit: int) -> None:
        await self._refuse(send, 413, f"request body over {limit} bytes")

    @staticmethod
    async def _not_json(send: Any, mtype: str | None, accepted: list[str] | None = None) -> None:
        what = "a body without a Content-Type" if mtype is None else f"content type {mtype!r}"
        await BodyPolicy._refuse(send, 415, f"{what} is not supported; send {' or '.join(accepted or [JSON_TYPE])}")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        route = self.route_policy(scope) if self.route_policy is not None else None
        limit = route.max_bytes if route is not None else self.max_bytes
        extra = route.extra_types if route is not None else frozenset()
        json_ok = route.json if route is not None else True
        accepted = route.accepted if route is not None else [JSON_TYPE]
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await self._too_large(send, limit)
        if scope["method"] not in BODY_METHODS:
            return await self.app(scope, receive, send)
        mtype = media_type(headers.get(b"content-type"))
        if mtype is not None and not (mtype == JSON_TYPE and json_ok) and mtype not in extra:
            return await self._not_json(send, mtype, accepted)
        if length is not None:
            if mtype is None and int(length) > 0:
                return await self._not_json(send, None, accepted)
            return await self.app(scope, receive, send)
        buf, more = bytearray(), True  # no Content-Length: read it (bounded) to know its size
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            buf += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(buf) > limit:
                return await self._too_large(send, limit)
        body = bytes(buf)
        if mtype is None and body:
            return await self._not_json(send, None, accepted)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
