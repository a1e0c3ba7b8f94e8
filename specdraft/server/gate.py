"""The ASGI middleware in front of the app: the API key, body size limit and request counting."""
from __future__ import annotations

import hmac

from .errors import error_response
from .metrics import ServerMetrics


class Gate:
    """Checks the API key of /v1/ requests where one is set (401 without it), bounds request
    bodies (413 before the app parses anything) and counts /v1/ responses by status. The body
    (at most ``limit`` bytes) is read here and replayed to the app."""

    def __init__(self, app, limit: int, metrics: ServerMetrics, api_key: str | None = None):
        self.app, self.limit, self.metrics = app, limit, metrics
        self.key = None if api_key is None else api_key.encode()

    def _keyed(self, headers: dict) -> bool:
        """The request carries the key: OpenAI's ``Authorization: Bearer KEY`` or Anthropic's ``x-api-key: KEY``."""
        bearer = headers.get(b"authorization", b"")
        given = bearer[7:] if bearer.startswith(b"Bearer ") else headers.get(b"x-api-key", b"")
        return hmac.compare_digest(given, self.key)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")

        async def counting_send(message):
            if message["type"] == "http.response.start" and path.startswith("/v1/"):
                self.metrics.requests.labels(path, str(message["status"])).inc()
            await send(message)

        if self.key is not None and path.startswith("/v1/") and not self._keyed(dict(scope["headers"])):
            refused = error_response(401, "this server needs its API key: send the header Authorization: Bearer KEY "
                                          "(or x-api-key: KEY)", code="invalid_api_key", path=path)
            return await refused(scope, receive, counting_send)

        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, counting_send)
        too_big = error_response(413, f"the request body exceeds {self.limit} bytes", path=path)
        size = dict(scope["headers"]).get(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > self.limit):
            return await too_big(scope, receive, counting_send)
        chunks, total, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.limit:
                return await too_big(scope, receive, counting_send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, counting_send)
