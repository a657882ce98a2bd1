"""A request-size limit: pure ASGI middleware, placed behind authentication.

A request whose ``Content-Length`` exceeds the limit is answered 413 before its
body is read; one without (chunked) is read up to the limit and answered 413
as soon as it goes past. The body is read here in full and handed on, so the
routes (which read whole bodies anyway) see it as usual."""

from __future__ import annotations

import json

DEFAULT_MAX_BODY_BYTES = 128 << 20  # a full heartbeat batch (200,000 regions) is ~65 MB


class BodyLimit:
    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_body_bytes must be a positive integer, got {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope["headers"]:
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    return await self._refuse(send, 400, "Content-Length is not an integer")
                if declared > self.max_bytes:
                    return await self._too_large(send, f"{declared} bytes declared")
                break
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await self._too_large(send, f"more than {self.max_bytes} bytes sent")
            chunks.append(body)
            more = message.get("more_body", False)
        whole = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)

    async def _too_large(self, send, what: str) -> None:
        await self._refuse(send, 413, f"request body too large: {what}; the limit is {self.max_bytes} bytes "
                                      "(opforge pd serve --max-body-bytes)")

    @staticmethod
    async def _refuse(send, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
