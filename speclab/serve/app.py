"""The OpenAI-compatible HTTP API over one AsyncEngine (FastAPI + uvicorn, as vLLM's api_server).

    POST /v1/completions, /v1/chat/completions    streaming (SSE) or not
    GET  /v1/models, /health, /version, /metrics   /metrics: prometheus_client's text format
    GET  /debug/state                              running/waiting/free KV blocks (speclab only)

With an API key (--api-key or SPECLAB_API_KEY) every route but health, version, metrics and the docs
needs `Authorization: Bearer <key>` (middleware.py).

One request can never take the server or another request down:
  * every 4xx/5xx has one shape, {"error": {"message", "type", "param", "code"}}, whose message names
    the field and the fix and never a path of this machine: a body that fails validation or a
    parameter out of range (checked in the float32/int64 form the engine uses) -> 400 (not FastAPI's
    422), a field the server cannot honour -> 400 naming it (protocol.UNSUPPORTED), an unknown model
    or path -> 404, a body over --max-request-body-bytes -> 413, the server full -> 503 with
    Retry-After, the engine dead -> 503 on /health;
  * prompts are tokenized off the event loop, and a string prompt certainly longer than the context
    (more characters than max_model_len tokens can cover) is refused before it is tokenized;
  * a failed engine step fails only its own requests (the loop goes on); a client that disconnects
    (mid-stream or while waiting for a whole response) has its request aborted in the engine, which
    frees its KV blocks at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from speclab.serve import protocol as P
from speclab.serve.async_engine import AsyncEngine, Delta, EngineDeadError, QueueFullError
from speclab.serve.metrics import ServingMetrics
from speclab.serve.middleware import APIKey, BodyLimit

logger = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES = 2**20


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_response(status: int, message: str, param: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse(P.error_body(message, status, param=param), status, headers=headers)


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][\w.+~-]+){2,}[/\\]?")


def scrub(message: str) -> str:
    """An engine error for a client: any file path in it replaced by <path> (the log keeps the original)."""
    return _PATH.sub("<path>", message)


def max_token_chars(tokenizer) -> int:
    """The most input characters one token can cover (its longest vocabulary string): a text of n
    characters is at least ceil(n / this) tokens, whatever the tokenizer makes of it."""
    return max(1, max((len(t) for t in tokenizer.get_vocab()), default=1))


class Server:
    """The state behind the routes: the engine loop, the tokenizer, the served name.

    Args:
        llm: a speclab.LLM (its engine, tokenizer and speculative config are served).
        served_model_name: the name clients send as `model` (and the metrics' model_name label).
        max_pending: requests held at once (running + waiting) before new ones get 503.
        api_key: the key every non-public route needs (None: no key).
        on_dead: called with the cause if the engine loop ever dies (the CLI exits the process).
    """

    def __init__(self, llm, served_model_name: str, max_pending: int, api_key: str | None = None, on_dead=None):
        self.llm, self.tokenizer, self.name, self.api_key = llm, llm.tokenizer, served_model_name, api_key
        spec = llm.engine.stats if llm.speculative_config is not None else None
        kv = llm.engine.kv
        counters = {"num_preemptions": lambda: llm.engine.scheduler.num_preemptions}
        if kv.enable_prefix_caching:
            counters.update(prefix_cache_queries=lambda: kv.prefix_cache_queries,
                            prefix_cache_hits=lambda: kv.prefix_cache_hits)
        self.metrics = ServingMetrics(served_model_name, spec, engine_counters=counters)
        self.engine = AsyncEngine(llm.engine, self.metrics, max_pending, llm.tokenizer, on_dead)
        self.created = int(time.time())
        self.token_chars = max_token_chars(llm.tokenizer)

    @property
    def max_model_len(self) -> int:
        return self.llm.engine.max_model_len

    # ------------------------------------------------------------------------------------------
    # request -> (prompt ids, params, stop strings); runs in a worker thread, never on the event loop

    def prepare(self, body: P._SamplingRequest, chat: bool):
        if body.model is not None and body.model != self.name:
            raise APIError(404, f"The model `{body.model}` does not exist: this server serves `{self.name}`", "model")
        try:
            body.check_supported()
            ids, params = self._chat(body) if chat else self._completion(body)
            stops = body.stop_strings()
            return self.engine.check(ids, params), params, stops
        except P.RequestProblem as e:
            raise APIError(400, str(e), e.param) from None
        except (ValueError, TypeError) as e:  # the engine's checks: context, vocabulary, KV pool
            raise APIError(400, str(e), "max_tokens" if "max_tokens" in str(e) else "prompt") from None

    def _completion(self, body: P.CompletionRequest):
        prompt = body.prompt_text_or_ids()
        if isinstance(prompt, str):
            self._refuse_certainly_too_long(len(prompt), "prompt")
            prompt = self.tokenizer.encode(prompt, add_special_tokens=body.field("add_special_tokens", True) is not False)
        return prompt, body.to_sampling_params(16)

    def _chat(self, body: P.ChatCompletionRequest):
        from speclab.chat import chat_prompt_ids, chat_stop_token_ids
        if not getattr(self.tokenizer, "chat_template", None):
            raise P.RequestProblem(f"the model `{self.name}` has no chat template: start the server with "
                                   f"--chat-template FILE, or send plain text to /v1/completions", "messages")
        msgs = body.message_dicts()
        self._refuse_certainly_too_long(sum(len(m["content"]) for m in msgs), "messages")
        ids = chat_prompt_ids(self.tokenizer, msgs, body.field("add_generation_prompt", True) is not False)
        params = body.to_sampling_params(max(1, self.max_model_len - len(ids)), chat_stop_token_ids(self.tokenizer))
        return ids, params

    def _refuse_certainly_too_long(self, num_chars: int, param: str) -> None:
        at_least = math.ceil(num_chars / self.token_chars)
        if at_least >= self.max_model_len:
            raise P.RequestProblem(f"the {param} has {num_chars} characters, so at least {at_least} tokens (no token "
                                   f"of this model covers more than {self.token_chars} characters), and the context "
                                   f"is {self.max_model_len} tokens (prompt + max_tokens): shorten the {param}", param)

    def submit(self, ids, params, stops):
        try:
            return self.engine.add(ids, params, stops)
        except (QueueFullError, EngineDeadError) as e:
            raise APIError(503, str(e)) from e

    # ------------------------------------------------------------------------------------------
    # generation

    @staticmethod
    async def deltas(stream: asyncio.Queue):
        """The request's Deltas until it ends (the engine thread detokenizes and applies stop strings)."""
        while True:
            d: Delta = await stream.get()
            yield d
            if d.finished:
                return

    async def complete(self, body, chat: bool, request: Request):
        ids, params, stops = await asyncio.to_thread(self.prepare, body, chat)
        key, stream = self.submit(ids, params, stops)
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            return StreamingResponse(self.sse(key, stream, body, chat, rid, len(ids)), media_type="text/event-stream")
        gather = asyncio.ensure_future(self.collect(stream))
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
            raise APIError(500, scrub(f"generation failed: {error}"))
        choice = P.completion_choice(text, reason, chat, delta=False)
        return JSONResponse(P.response_body(rid, self.name, [choice], chat, False, P.usage(len(ids), n)))

    async def collect(self, stream):
        pieces, n, last = [], 0, None
        async for d in self.deltas(stream):
            pieces.append(d.text)
            n += len(d.token_ids)
            last = d
        return "".join(pieces), n, last.finish_reason, last.error

    async def sse(self, key, stream, body, chat: bool, rid: str, prompt_len: int):
        """Server-sent events: one `data: {json}` per engine step, usage last if asked, then [DONE]."""
        finished, first, n = False, True, 0
        opts = body.stream_options
        include_usage, every = opts is not None and opts.include_usage, opts is not None and opts.continuous_usage_stats
        created = int(time.time())
        event = lambda obj: f"data: {json.dumps(obj)}\n\n"  # noqa: E731
        try:
            async for d in self.deltas(stream):
                n += len(d.token_ids)
                finished = d.finished
                if d.finish_reason == "error":
                    yield event(P.error_body(scrub(f"generation failed: {d.error}"), 500))
                    break
                if d.text or d.finished or first:
                    choice = P.completion_choice(d.text, d.finish_reason if d.finished else None, chat, True, first)
                    yield event(P.response_body(rid, self.name, [choice], chat, True,
                                                P.usage(prompt_len, n) if every else None, created))
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


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """FastAPI's first validation error as (message naming the field, param)."""
    err = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in err.get("loc", ())[1:]]
    if err.get("type") == "json_invalid":  # loc holds a character offset, not a field
        return f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')}): send a JSON object", None
    param = ".".join(loc) or None
    if err.get("type") == "missing":
        return f"{param} is required", param
    msg = err.get("msg", "invalid request")
    return (f"{param}: {msg}" if param else msg), param


def add_error_handlers(app: FastAPI) -> None:
    """Every error in one shape (protocol.error_body), with no path or traceback of this machine."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return error_response(400, *validation_message(exc))

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param,
                              headers={"Retry-After": "1"} if exc.status == 503 else None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        message = {404: f"no route {request.method} {request.url.path}: the API is /v1/completions, "
                        f"/v1/chat/completions and /v1/models",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        if exc.detail == "There was an error parsing the body":
            message = "the body could not be parsed: send UTF-8 encoded JSON"
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def _internal(request, exc: Exception):
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal server error ({type(exc).__name__}); the server logged the details")


# The endpoints read the server from the app (request.app.state.server), never from a closure: FastAPI keeps
# every endpoint function it has classified in a module-wide cache (fastapi.dependencies.models, an lru_cache
# of 4,096), so an endpoint closed over `server` kept each app's engine, with its model and KV pool, alive
# after the app was gone (a test process that built many apps held 0.35-1 GB more for it, 2026-12-06).


def _server(request: Request) -> "Server":
    return request.app.state.server


async def completions(body: P.CompletionRequest, request: Request):
    return await _server(request).complete(body, False, request)


async def chat_completions(body: P.ChatCompletionRequest, request: Request):
    return await _server(request).complete(body, True, request)


async def models(request: Request):
    server = _server(request)
    card = {"id": server.name, "object": "model", "created": server.created, "owned_by": "speclab",
            "root": server.name, "parent": None, "max_model_len": server.max_model_len}
    return {"object": "list", "data": [card]}


async def health(request: Request):
    return Response(status_code=200 if _server(request).engine.alive else 503)


async def version():
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v
    try:
        return {"version": v("speclab")}
    except PackageNotFoundError:
        return {"version": "unknown"}


async def metrics(request: Request):
    return Response(generate_latest(_server(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def debug_state(request: Request):
    return _server(request).engine.debug_state()



def build_app(server: Server, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        server.engine.start()
        yield
        server.engine.shutdown()

    app = FastAPI(title="speclab serve", lifespan=lifespan)
    app.state.server = server
    add_error_handlers(app)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    if server.api_key is not None:
        app.add_middleware(APIKey, api_key=server.api_key)  # added last: outermost, before the body is read

    app.post("/v1/completions")(completions)
    app.post("/v1/chat/completions")(chat_completions)
    app.get("/v1/models")(models)
    app.get("/health")(health)
    app.get("/version")(version)
    app.get("/metrics")(metrics)
    app.get("/debug/state")(debug_state)
    return app
