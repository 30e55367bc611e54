"""Two guards in front of every route, as plain ASGI middleware: a body-size limit and the API key.

Body size. A request body is read here, up to `max_body_bytes` (speclab's `--max-request-body-bytes`,
1 MiB by default: a full-context prompt of any model here is a few hundred KB of JSON at most). A
larger body is answered with 413 in the OpenAI error shape, after the rest of it is read and thrown
away in chunks (so the client hears the answer instead of a reset connection, and memory never holds
more than one chunk of it); beyond `DISCARD_LIMIT` the connection is simply closed. One huge body
therefore costs the event loop a few milliseconds of reading, never a parse or a tokenization.

API key (vLLM's `--api-key`, with three fixes vLLM's own guard lacks or that the issue asked for):
every route but the public ones (`PUBLIC_PATHS`: health, version, metrics, the API docs) needs
`Authorization: Bearer <key>`; the scheme is case-insensitive (RFC 7235); the key is compared in
constant time (`hmac.compare_digest` on SHA-256 digests, as vLLM compares them). A missing or wrong
key gets 401 in the OpenAI error shape (vLLM answers `{"error": "Unauthorized"}`; one shape for every
error here, which the openai client reads the same way).
"""

from __future__ import annotations

import hashlib
import hmac
import json

from speclab.serve.protocol import error_body

PUBLIC_PATHS = ("/health", "/version", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
DISCARD_LIMIT = 256 * 2**20  # read and drop at most this much of an oversized body before closing


async def send_error(send, status: int, message: str, param: str | None = None, headers=()) -> None:
    body = json.dumps(error_body(message, status, param=param)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Read the whole body (at most `max_body_bytes`) before the app sees it; 413 beyond that."""

    def __init__(self, app, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        size, chunks, more = 0, [], True
        too_big = declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            piece = message.get("body", b"")
            size += len(piece)
            more = message.get("more_body", False)
            too_big = too_big or size > self.max_body_bytes
            if too_big:
                chunks = []  # drop what was kept: nothing of an oversized body stays in memory
                if size > DISCARD_LIMIT:
                    break
            else:
                chunks.append(piece)
        if too_big:
            what = f"{int(declared)} bytes" if declared is not None and declared.isdigit() else \
                f"more than {self.max_body_bytes} bytes"
            return await send_error(send, 413, f"the request body ({what}) exceeds this server's limit of "
                                               f"{self.max_body_bytes} bytes: send a shorter prompt, or start the "
                                               f"server with a larger --max-request-body-bytes")
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later reads wait for the disconnect, as the app expects

        return await self.app(scope, replay, send)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class APIKey:
    """401 unless a non-public route carries `Authorization: Bearer <key>` (scheme in any case)."""

    def __init__(self, app, api_key: str):
        self.app, self.digest = app, _digest(api_key)

    def allowed(self, scope) -> bool:
        if scope["method"] == "OPTIONS" or scope["path"] in PUBLIC_PATHS:
            return True
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, key = header.partition(" ")
        return hmac.compare_digest(_digest(key.strip() if scheme.lower() == "bearer" else "\0"), self.digest) \
            and scheme.lower() == "bearer"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.allowed(scope):
            return await self.app(scope, receive, send)
        return await send_error(send, 401, "Unauthorized: send the header `Authorization: Bearer <key>` with the "
                                           "server's key (--api-key or SPECLAB_API_KEY)",
                                headers=[(b"www-authenticate", b"Bearer")])
