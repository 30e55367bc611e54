"""Timing on a noisy CPU: medians of repeated runs, the cost of one forward of speclab's model, and
where an engine step's time goes (`time_breakdown`).

Used by the benchmarks, the demo, the training report and the lessons, so that every figure in
the course is measured the same way. Never used to assert a speed in a test.
"""

import contextlib
import statistics
import time

import torch

from speclab.cpu_info import cpu_name


def machine_info(threads: int | None = None) -> dict:
    """What a benchmark ran on, for its JSON and its header: CPU (cpu_name), cores, torch, threads, load average."""
    import os

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": threads if threads is not None else torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def median_seconds(fn, repeat: int = 20, warmup: int = 2) -> float:
    """Median wall time of `fn()` over `repeat` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timed(fn):
    """(fn's result, seconds it took): one timed call."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def wrap_timed(obj, name: str, on_call) -> None:
    """Wrap the method `obj.name` so that every call reports (seconds, args, result) to `on_call`;
    the wrapper is an instance attribute: `del obj.<name>` (or `unwrap`) restores the method."""
    fn = getattr(obj, name)

    def timed_fn(*args, **kwargs):
        start = time.perf_counter()
        out = None
        try:
            out = fn(*args, **kwargs)
            return out
        finally:
            on_call(time.perf_counter() - start, args, out)
    setattr(obj, name, timed_fn)


def unwrap(obj, name: str) -> None:
    """Remove a `wrap_timed` wrapper (the class's method shows through again)."""
    delattr(obj, name)


def forward_seconds(model, context: int = 128, tokens: int = 1, repeat: int = 40) -> float:
    """Median time of one forward of speclab's paged-KV model at batch 1: `tokens` new tokens (1: a
    decode step; k + 1: a verification) with `context` tokens already cached, logits included."""
    from speclab.engine.batch import flatten
    from speclab.kv_cache import KVCacheManager

    kv = KVCacheManager((context + tokens) // 16 + 2, 16)
    caches = model.allocate_kv_cache(kv.pool.num_blocks, 16)
    kv.allocate("r", 0, context + tokens)
    ids = torch.randint(0, model.config.vocab_size, (context + tokens,)).tolist()
    model(*flatten(kv, [("r", ids[:context], 0)]), caches)
    batch = flatten(kv, [("r", ids[context:], context)])  # the same positions are rewritten: the cache stays valid
    return median_seconds(lambda: model.compute_logits(model(*batch, caches)[0]), repeat=repeat)


class StepTimes(dict):
    """Seconds per part of the engine's steps, filled by `time_breakdown`: "target forward" (the
    target's layers and its logits), "propose" (the proposer: a draft model's forwards, or a lookup),
    "verify" (acceptance and sampling from the logits), "other" (the scheduler, batching, the KV
    cache's bookkeeping, Python: the wall time no part accounts for) and "total". `forwards` holds
    (new tokens, seconds) per target forward (layers only), and `steps` counts them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.forwards: list[tuple[int, float]] = []

    @property
    def steps(self) -> int:
        return len(self.forwards)

    def without_prefill(self, max_tokens: int) -> "StepTimes":
        """The decode steps alone: forwards of more than `max_tokens` new tokens (prompt prefills, at
        batch 1) are taken out of "target forward", "total" and the step count. The proposer's own
        prefill of a prompt stays in "propose"."""
        out = StepTimes(self)
        out.forwards = [(n, s) for n, s in self.forwards if n <= max_tokens]
        prefill = sum(s for n, s in self.forwards if n > max_tokens)
        out["target forward"] -= prefill
        out["total"] -= prefill
        return out

    def per_step_ms(self) -> dict[str, float]:
        return {part: 1e3 * s / max(self.steps, 1) for part, s in self.items()}

    def shares(self) -> dict[str, float]:
        return {part: s / self["total"] for part, s in self.items() if part != "total"}


@contextlib.contextmanager
def time_breakdown(engine):
    """Time the parts of every engine step run inside the block (for the lessons; not for tests).

        with time_breakdown(llm.engine) as t:
            llm.generate(prompts, params)
        print(t.per_step_ms(), t.shares())

    The parts are timed by wrapping, for the duration of the block, the target model's `forward`
    and `compute_logits`, the runner's verification methods and the proposer's `propose`; nothing
    else changes, and the wrappers are removed on exit.
    """
    times = StepTimes({"target forward": 0.0, "propose": 0.0, "verify": 0.0})
    runner = engine.runner
    parts = [(runner.model, "forward", "target forward"), (runner.model, "compute_logits", "target forward"),
             (runner, "verify_greedy", "verify"), (runner, "verify", "verify")]
    if runner.proposer is not None:
        parts.append((runner.proposer, "propose", "propose"))
    wrapped = []

    def add(part, name):
        def on_call(seconds, args, _out):
            times[part] += seconds
            if name == "forward":
                times.forwards.append((int(args[0].numel()), seconds))
        return on_call

    for obj, name, part in parts:
        if hasattr(obj, name):
            wrap_timed(obj, name, add(part, name))
            wrapped.append((obj, name))
    start = time.perf_counter()
    try:
        yield times
    finally:
        times["total"] = time.perf_counter() - start
        times["other"] = times["total"] - sum(times[p] for p in ("target forward", "propose", "verify"))
        for obj, name in wrapped:
            unwrap(obj, name)
