"""Bearer-token authentication: pure ASGI middleware in front of every route."""

from __future__ import annotations

import hashlib
import hmac
import json


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class BearerAuth:
    """Pure ASGI middleware: every HTTP request needs ``Authorization: Bearer <token>``."""

    def __init__(self, app, token: str):
        self.app = app
        self._expected = _digest(b"Bearer " + token.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            got = b""
            for k, v in scope["headers"]:
                if k == b"authorization":
                    got = v
                    break
            if not hmac.compare_digest(_digest(got), self._expected):
                body = json.dumps({"error": "missing or wrong bearer token" if got else
                                   "authorization required: send 'Authorization: Bearer <token>'"}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()),
                                        (b"www-authenticate", b'Bearer realm="opforge-pd"')]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
