"""The OpenAI-compatible HTTP API over one AsyncEngine (FastAPI + uvicorn, as vLLM's api_server).

    POST /v1/completions, /v1/chat/completions    streaming (SSE) or not
    GET  /v1/models, /health, /version, /metrics   /metrics: prometheus_client's text format
    GET  /debug/state                              running/waiting/free KV blocks (speclab only)

With --api-key, /v1 paths need `Authorization: Bearer <key>` (401 {"error": "Unauthorized"} otherwise,
as vLLM answers); /health and /metrics stay open.

Status codes as vLLM's: a body that fails validation or a parameter out of range -> 400 (not
FastAPI's 422) in the shape {"error": {"message", "type", "param", "code"}}; an unknown model ->
404; the server full -> 503 with Retry-After; the engine dead -> 503 on /health. A client that
disconnects (mid-stream or while waiting for a whole response) has its request aborted in the
engine, which frees its KV blocks at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from speclab.serve import protocol as P
from speclab.serve.async_engine import AsyncEngine, Delta, EngineDeadError, QueueFullError
from speclab.serve.detokenize import TextStream
from speclab.serve.metrics import ServingMetrics


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_response(status: int, message: str, param: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse(P.error_body(message, status, P.ERROR_TYPES.get(status, "Error"), param), status,
                        headers=headers)


class Server:
    """The state behind the routes: the engine loop, the tokenizer, the served name.

    Args:
        llm: a speclab.LLM (its engine, tokenizer and speculative config are served).
        served_model_name: the name clients send as `model` (and the metrics' model_name label).
        max_pending: requests held at once (running + waiting) before new ones get 503.
    """

    def __init__(self, llm, served_model_name: str, max_pending: int, api_key: str | None = None):
        self.llm, self.tokenizer, self.name, self.api_key = llm, llm.tokenizer, served_model_name, api_key
        spec = llm.engine.stats if llm.speculative_config is not None else None
        self.metrics = ServingMetrics(served_model_name, spec)
        self.engine = AsyncEngine(llm.engine, self.metrics, max_pending)
        self.created = int(time.time())

    # ------------------------------------------------------------------------------------------
    # request -> (prompt ids, params)

    def prepare(self, body: P._SamplingRequest, chat: bool):
        if body.model is not None and body.model != self.name:
            raise APIError(404, f"The model `{body.model}` does not exist.", "model")
        problem = body.unsupported()
        if problem:
            raise APIError(400, problem)
        try:
            if chat:
                from speclab.chat import chat_prompt_ids, chat_stop_token_ids
                msgs = [m.model_dump() for m in body.messages]
                ids, extra_stop = chat_prompt_ids(self.tokenizer, msgs), chat_stop_token_ids(self.tokenizer)
                params = body.to_sampling_params(self.default_max_tokens(len(ids)), extra_stop)
            else:
                prompt = body.single_prompt()
                ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
                params, extra_stop = body.to_sampling_params(16), ()
            stops = body.stop_strings()
            return self.engine.check(ids, params), params, stops
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e)) from e

    def default_max_tokens(self, prompt_len: int) -> int:
        """Chat: like OpenAI, an unset max_tokens means 'up to the context' (vLLM: max_model_len - prompt)."""
        return max(1, self.llm.engine.max_model_len - prompt_len)

    def submit(self, ids, params):
        try:
            return self.engine.add(ids, params)
        except QueueFullError as e:
            raise APIError(503, str(e)) from e
        except EngineDeadError as e:
            raise APIError(503, str(e)) from e

    # ------------------------------------------------------------------------------------------
    # generation

    async def deltas(self, key, stream: asyncio.Queue, text: TextStream):
        """(text delta, Delta) per engine step until the request ends; stop strings end it here."""
        while True:
            d: Delta = await stream.get()
            piece = text.push(d.token_ids, d.finished)
            if text.stopped:  # the text ends before the stop string: finish_reason "stop" (OpenAI's rule)
                if not d.finished:
                    self.engine.abort(key, "stop")
                d = Delta(d.token_ids, True, "stop")
            yield piece, d
            if d.finished:
                return

    async def complete(self, body, chat: bool, request: Request):
        ids, params, stops = self.prepare(body, chat)
        key, stream = self.submit(ids, params)
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            return StreamingResponse(self.sse(key, stream, body, chat, rid, len(ids), stops),
                                     media_type="text/event-stream")
        gather = asyncio.ensure_future(self.collect(key, stream, stops))
        gone = asyncio.ensure_future(wait_for_disconnect(request))
        try:
            await asyncio.wait([gather, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not gather.done():  # the client left: free its blocks now
            gather.cancel()
            self.engine.abort(key)
            return Response(status_code=499)
        text, n, reason, error = gather.result()
        if reason == "error":
            raise APIError(500, f"generation failed: {error}")
        choice = P.completion_choice(text, reason, chat, delta=False)
        return JSONResponse(P.response_body(rid, self.name, [choice], chat, False, P.usage(len(ids), n)))

    async def collect(self, key, stream, stops):
        text, n, last = TextStream(self.tokenizer, stops), 0, None
        out = []
        async for piece, d in self.deltas(key, stream, text):
            out.append(piece)
            n += len(d.token_ids)
            last = d
        return "".join(out), n, last.finish_reason, last.error

    async def sse(self, key, stream, body, chat: bool, rid: str, prompt_len: int, stops):
        """Server-sent events: one `data: {json}` per engine step, usage last if asked, then [DONE]."""
        finished, first, n = False, True, 0
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        created = int(time.time())
        event = lambda obj: f"data: {json.dumps(obj)}\n\n"  # noqa: E731
        try:
            async for piece, d in self.deltas(key, stream, TextStream(self.tokenizer, stops)):
                n += len(d.token_ids)
                finished = d.finished
                if d.finish_reason == "error":
                    yield event(P.error_body(f"generation failed: {d.error}", 500, "InternalServerError"))
                    break
                if piece or d.finished or first:
                    choice = P.completion_choice(piece, d.finish_reason if d.finished else None, chat, True, first)
                    yield event(P.response_body(rid, self.name, [choice], chat, True, created=created))
                    first = False
            if include_usage:
                yield event(P.response_body(rid, self.name, [], chat, True, P.usage(prompt_len, n), created))
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away mid-stream (the generator was cancelled or closed)
                self.engine.abort(key)


async def wait_for_disconnect(request: Request) -> None:
    """Return when the client closes the connection (ASGI http.disconnect), as vLLM's with_cancellation."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def build_app(server: Server) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        server.engine.start()
        yield
        server.engine.shutdown()

    app = FastAPI(title="speclab serve", lifespan=lifespan)
    app.state.server = server

    if server.api_key is not None:
        @app.middleware("http")
        async def authenticate(request: Request, call_next):
            """vLLM's --api-key: only /v1 paths are guarded; a wrong or missing key gets 401."""
            if request.method != "OPTIONS" and request.url.path.startswith("/v1") and \
                    request.headers.get("authorization") != f"Bearer {server.api_key}":
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(x) for x in err.get("loc", ())[1:]) or None
        return error_response(400, f"{err.get('msg', 'invalid request')} ({param})" if param else
                              err.get("msg", "invalid request"), param)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param,
                              headers={"Retry-After": "1"} if exc.status == 503 else None)

    @app.post("/v1/completions")
    async def completions(body: P.CompletionRequest, request: Request):
        return await server.complete(body, False, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: P.ChatCompletionRequest, request: Request):
        return await server.complete(body, True, request)

    @app.get("/v1/models")
    async def models():
        card = {"id": server.name, "object": "model", "created": server.created, "owned_by": "speclab",
                "root": server.name, "parent": None, "max_model_len": server.llm.engine.max_model_len}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health():
        return Response(status_code=200 if server.engine.alive else 503)

    @app.get("/version")
    async def version():
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as v
        try:
            return {"version": v("speclab")}
        except PackageNotFoundError:
            return {"version": "unknown"}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/state")
    async def debug_state():
        return server.engine.debug_state()

    return app
