"""One engine loop for all clients: a background thread steps an LLMEngine, asyncio handlers stream.

vLLM runs its engine core in another process and streams outputs to the API server's asyncio loop
(`AsyncLLM`). Here the engine runs in one background thread of the server process:

    handler (asyncio)            engine thread
    add(ids, params) ----------> commands queue --> engine.add_request
    async for delta in stream <- per-request asyncio.Queue <-- after each engine.step(), new tokens
    abort(rid) ----------------> commands queue --> engine.abort (blocks freed at once)

Only the engine thread touches the LLMEngine (it is not thread-safe). Requests from all clients sit
in the one scheduler, so they are batched continuously: a request that arrives mid-generation joins
the next step. The thread also stamps each request's timings (arrival, first token, each step's
tokens) for the latency metrics: the serving layer owns timing, the engine does not.

The same thread detokenizes and checks stop strings (vLLM's output processor), so one place decides
what a request produced and why it ended: the Delta a client receives and the metrics' counts are
made from the same tokens and the same finish_reason (a stop string completed by the last allowed
token is "stop" for both; tokens after a stop string are neither sent nor counted).

A failed engine step fails only its requests (LLMEngine.step). Should the loop itself ever die, every
waiting client hears of it, /health answers 503 and `on_dead` is called with the cause (the CLI
exits the process then, as vLLM's watchdog does, so a supervisor can restart it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from speclab.engine.llm_engine import LLMEngine
from speclab.engine.request import Request
from speclab.sampling_params import SamplingParams
from speclab.serve.detokenize import TextStream
from speclab.serve.metrics import ServingMetrics

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The server holds as many requests as it accepts; the client should retry later (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an exception; the server cannot generate (HTTP 503 on /health)."""


@dataclass
class Delta:
    """New tokens of one request from one engine step (or its end), and the text they add."""

    token_ids: list[int]
    text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class _Tracked:
    key: int
    request: Request
    stream: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival: float
    text: TextStream
    sent: int = 0  # engine tokens looked at (kept ones go to the client)
    num_kept: int = 0
    first: float | None = None
    last: float | None = None
    reason: str | None = None  # set when the server ends it (stop string, client gone)
    done: bool = field(default=False)


class AsyncEngine:
    """Args:
        engine: the LLMEngine to drive (owned by the loop thread from now on).
        metrics: where timings and counts go.
        max_pending: the most requests held at once (running + waiting); one more gets QueueFullError.
        tokenizer: decodes each request's tokens (stop strings are found in the text).
        on_dead: called (from the loop thread) with the exception if the loop ever dies.
    """

    def __init__(self, engine: LLMEngine, metrics: ServingMetrics, max_pending: int, tokenizer,
                 on_dead: Callable[[BaseException], None] | None = None):
        self.engine, self.metrics, self.max_pending = engine, metrics, max_pending
        self.tokenizer, self.on_dead = tokenizer, on_dead
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._tracked: dict[int, _Tracked] = {}  # by the server's key (the engine's ids are its own)
        self._keys = itertools.count()
        self._num_pending = 0  # admitted by add() and not yet finished; guarded by _lock
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="speclab-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    # ------------------------------------------------------------------------------------------
    # called from asyncio handlers

    def check(self, prompt_ids, params: SamplingParams) -> list[int]:
        """Validate a request without queueing it (reads only constants of the engine): ValueError -> 400."""
        return self.engine.check_request(prompt_ids, params)

    def add(self, prompt_ids: list[int], params: SamplingParams, stop: list[str] = ()) -> tuple[int, asyncio.Queue]:
        """Queue a request without waiting for the engine thread; returns the key that `abort` takes
        and the asyncio.Queue its Deltas arrive on. `stop`: stop strings (the text ends before them)."""
        if not self.alive:
            raise EngineDeadError(f"the engine loop has stopped: {self.error!r}")
        with self._lock:
            if self._num_pending >= self.max_pending:
                raise QueueFullError(f"the server is full ({self.max_pending} requests running or waiting); "
                                     f"retry later, or start it with a larger --max-pending-requests")
            self._num_pending += 1
        key, stream = next(self._keys), asyncio.Queue()
        self._commands.put(("add", key, prompt_ids, params, stream, asyncio.get_running_loop(), time.monotonic(),
                            list(stop)))
        self._wake.set()
        return key, stream

    def abort(self, key: int) -> None:
        """End a request now (the client is gone: finish_reason "abort"); its blocks are freed."""
        self._commands.put(("abort", key, "abort"))
        self._wake.set()

    # ------------------------------------------------------------------------------------------
    # the engine thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._apply_commands()
                if self.engine.has_unfinished():
                    self.engine.step()
                    self._emit()
                else:
                    self._publish_state()
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
        except BaseException as e:  # noqa: BLE001 - every waiting client must hear of it
            self.error = e
            logger.critical("the engine loop died: %r", e, exc_info=e)
            for t in list(self._tracked.values()):
                self._finish(t, "error", error=f"the engine loop stopped ({type(e).__name__})")
        finally:
            self._drain_after_stop()
        if self.error is not None and self.on_dead is not None:
            self.on_dead(self.error)

    def _drain_after_stop(self) -> None:
        """Answer any request that arrived after the loop ended, so that no handler waits forever."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                with self._lock:
                    self._num_pending -= 1
                cmd[5].call_soon_threadsafe(cmd[4].put_nowait, Delta([], "", True, "error", "the engine loop has stopped"))

    def _apply_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, key, ids, params, stream, loop, arrival, stop = cmd
                try:
                    req = self.engine.add_request(ids, params)
                except Exception as e:  # noqa: BLE001 - checked before, but the client must hear of it
                    with self._lock:
                        self._num_pending -= 1
                    loop.call_soon_threadsafe(stream.put_nowait, Delta([], "", True, "error", str(e)))
                    continue
                self._tracked[key] = _Tracked(key, req, stream, loop, arrival, TextStream(self.tokenizer, stop))
            else:
                _, key, reason = cmd
                t = self._tracked.get(key)
                if t is not None and not t.done:  # (its tokens so far were sent after the last step)
                    self.engine.abort([t.request.request_id], reason)
                    self._finish(t, reason)

    def _emit(self) -> None:
        now = time.monotonic()
        for t in list(self._tracked.values()):
            self._emit_one(t, now)
        self._publish_state()

    def _emit_one(self, t: _Tracked, now: float) -> None:
        """Send a request's new tokens and text; end it here when its text reaches a stop string."""
        req = t.request
        new = req.output_token_ids[t.sent:]
        t.sent = len(req.output_token_ids)
        if not new and not req.is_finished:
            return
        kept, piece = t.text.push(new, req.is_finished)
        if t.text.stopped:  # the text ends before the stop string: "stop" (OpenAI's rule), for client and metrics
            t.reason = "stop"
            if not req.is_finished:
                self.engine.abort([req.request_id], "stop")
        if kept:
            self.metrics.observe_tokens(len(kept), t.first is None, len(req.prompt_token_ids),
                                        now - (t.arrival if t.first is None else t.last))
            t.first = now if t.first is None else t.first
            t.last, t.num_kept = now, t.num_kept + len(kept)
        if req.is_finished:
            self._finish(t, t.reason or req.finish_reason, kept, piece, req.error)
        elif kept or piece:
            t.loop.call_soon_threadsafe(t.stream.put_nowait, Delta(kept, piece))

    def _finish(self, t: _Tracked, reason: str, new=(), piece: str = "", error: str | None = None) -> None:
        """The one place a request's finish_reason is decided: the client's last Delta and the metrics get it."""
        t.done = True
        self._tracked.pop(t.key, None)
        with self._lock:
            self._num_pending -= 1
        end = t.last if t.last is not None else time.monotonic()
        self.metrics.observe_finished(reason, end - t.arrival, (t.last or end) - (t.first or end), t.num_kept)
        t.loop.call_soon_threadsafe(t.stream.put_nowait, Delta(list(new), piece, True, reason, error))

    def _publish_state(self) -> None:
        s, kv = self.engine.scheduler, self.engine.kv
        pool = kv.pool.num_blocks
        self.metrics.set_state(len(s.running), len(s.waiting), (pool - kv.num_free_blocks) / pool)

    def debug_state(self) -> dict:
        """A snapshot for tests and operators (read without locking: counts may be one step apart)."""
        s, kv = self.engine.scheduler, self.engine.kv
        state = {"num_running": len(s.running), "num_waiting": len(s.waiting), "num_tracked": len(self._tracked),
                 "num_free_kv_blocks": kv.num_free_blocks, "num_kv_blocks": kv.pool.num_blocks, "alive": self.alive}
        policy = self.engine.spec_policy
        if policy is not None:  # which k the dynamic policy chose lately, by batch size
            for _ in range(10):  # the engine thread may append while we copy: try again
                try:
                    state["spec_policy"] = self._policy_state(policy)
                    break
                except RuntimeError:  # deque mutated during iteration
                    continue
        return state

    @staticmethod
    def _policy_state(policy) -> dict:
        recent = list(zip(list(policy.batch_sizes)[-500:], list(policy.history)[-500:]))
        by_size: dict = {}
        for b, k in recent:
            by_size.setdefault(str(b), {}).setdefault(str(k), 0)
            by_size[str(b)][str(k)] += 1
        out = {"type": type(policy).__name__, "recent_k_by_batch_size": by_size}
        if hasattr(policy, "fit") and policy.target:
            out["fit"] = policy.fit()
        return out
