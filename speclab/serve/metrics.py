"""The server's Prometheus metrics, named as vLLM v1's (`vllm/v1/metrics/loggers.py`) under `speclab:`.

    speclab:num_requests_running / _waiting          gauges, set after every engine step
    speclab:kv_cache_usage_perc                      gauge, fraction 0-1 of KV blocks in use
    speclab:prompt_tokens_total                      a request's prompt, added when its first token comes
    speclab:generation_tokens_total                  every token sent to a client (accepted drafts + the
                                                     bonus; none after a stop string)
    speclab:request_success_total{finished_reason}   stop / length / abort / error, each pre-created at 0:
                                                     the finish_reason the client was told, counted once
    speclab:num_preemptions_total                    requests preempted (recomputed later), as vLLM's
    speclab:prefix_cache_queries_total / _hits_total prompt tokens looked up in the prefix cache, and found
                                                     (only with --enable-prefix-caching)
    speclab:time_to_first_token_seconds              histogram: arrival -> the step that emits token 1
    speclab:inter_token_latency_seconds              histogram: one observation per engine step per request
    speclab:time_per_output_token_seconds            the same observations (vLLM's deprecated name)
    speclab:request_time_per_output_token_seconds    per finished request: decode time / (tokens - 1)
    speclab:e2e_request_latency_seconds              histogram: arrival -> last token
    speclab:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total,
    speclab:spec_decode_num_accepted_tokens_per_pos_total{position}
                                                     read from the engine's own counters at scrape time,
                                                     so Prometheus sees exactly what the engine counted

Every series carries `model_name` (the served name) and `engine` ("0"), as vLLM's do. Unlike vLLM
(issue #31503), aborted requests (client gone) are counted under finished_reason="abort".
The histogram buckets are vLLM's, blind spots included (no 2 s TTFT boundary; ITL starts at 10 ms).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from speclab.metrics import SpecDecodingStats

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort", "error")


class SpecDecodeCollector:
    """Exposes a SpecDecodingStats as vLLM's four spec-decode counters, read when scraped."""

    def __init__(self, stats: SpecDecodingStats, labels: dict[str, str], prefix: str = "speclab"):
        self.stats, self.labels, self.prefix = stats, labels, prefix

    def collect(self):
        names, values = list(self.labels), list(self.labels.values())
        s = self.stats
        for name, doc, value in [("num_drafts", "Number of spec decoding drafts.", s.num_drafts),
                                 ("num_draft_tokens", "Number of draft tokens.", s.num_draft_tokens),
                                 ("num_accepted_tokens", "Number of accepted tokens.", s.num_accepted_tokens)]:
            fam = CounterMetricFamily(f"{self.prefix}:spec_decode_{name}", doc, labels=names)
            fam.add_metric(values, value)
            yield fam
        fam = CounterMetricFamily(f"{self.prefix}:spec_decode_num_accepted_tokens_per_pos",
                                  "Accepted tokens per draft position.", labels=names + ["position"])
        for i, n in enumerate(list(s.num_accepted_tokens_per_pos)):
            fam.add_metric(values + [str(i)], n)
        yield fam


ENGINE_COUNTERS = {  # vLLM's counters that the engine itself keeps, read when scraped
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
}


class EngineCounterCollector:
    """Exposes counters the engine keeps (ENGINE_COUNTERS' names) as vLLM's, read when scraped."""

    def __init__(self, reads: dict, labels: dict[str, str], prefix: str = "speclab"):
        self.reads, self.labels, self.prefix = reads, labels, prefix

    def collect(self):
        for name, read in self.reads.items():
            fam = CounterMetricFamily(f"{self.prefix}:{name}", ENGINE_COUNTERS[name], labels=list(self.labels))
            fam.add_metric(list(self.labels.values()), read())
            yield fam


class ServingMetrics:
    """Args:
        model_name: the served model name (the `model_name` label).
        spec_stats: the engine's spec-decode counters, or None without speculation (then no
            spec_decode_* series, as in vLLM).
        engine_counters: {name in ENGINE_COUNTERS: a function that reads it} (the preemption count;
            the prefix cache's queried and hit tokens when it is on).
    """

    def __init__(self, model_name: str, spec_stats: SpecDecodingStats | None = None, prefix: str = "speclab",
                 engine_counters: dict | None = None):
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name, "engine": "0"}
        names, reg, p = list(self.labels), self.registry, prefix
        self.running = Gauge(f"{p}:num_requests_running", "Number of requests in model execution batches.",
                             names, registry=reg).labels(**self.labels)
        self.waiting = Gauge(f"{p}:num_requests_waiting", "Number of requests waiting to be processed.",
                             names, registry=reg).labels(**self.labels)
        self.kv_usage = Gauge(f"{p}:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                              names, registry=reg).labels(**self.labels)
        self.prompt_tokens = Counter(f"{p}:prompt_tokens", "Number of prefill tokens processed.", names,
                                     registry=reg).labels(**self.labels)
        self.generation_tokens = Counter(f"{p}:generation_tokens", "Number of generation tokens processed.",
                                         names, registry=reg).labels(**self.labels)
        success = Counter(f"{p}:request_success", "Count of finished requests, by finish reason.",
                          names + ["finished_reason"], registry=reg)
        self.success = {r: success.labels(**self.labels, finished_reason=r) for r in FINISH_REASONS}
        hist = lambda name, doc, buckets: Histogram(f"{p}:{name}", doc, names, buckets=buckets,  # noqa: E731
                                                    registry=reg).labels(**self.labels)
        self.ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = hist("time_per_output_token_seconds", "Histogram of time per output token in seconds "
                         "(deprecated in vLLM 0.11: the same observations as inter_token_latency).", ITL_BUCKETS)
        self.request_tpot = hist("request_time_per_output_token_seconds",
                                 "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS)
        if spec_stats is not None:
            reg.register(SpecDecodeCollector(spec_stats, self.labels, prefix))
        if engine_counters:
            reg.register(EngineCounterCollector(engine_counters, self.labels, prefix))

    def observe_tokens(self, num_new: int, first: bool, prompt_len: int, since_last: float) -> None:
        """One engine step gave a request `num_new` tokens; `since_last` is the time since its arrival
        (first) or since its previous tokens (an inter-token latency sample, per step not per token)."""
        self.generation_tokens.inc(num_new)
        if first:
            self.prompt_tokens.inc(prompt_len)
            self.ttft.observe(since_last)
        else:
            self.itl.observe(since_last)
            self.tpot.observe(since_last)

    def observe_finished(self, reason: str, e2e: float, decode_time: float, num_tokens: int) -> None:
        self.success[reason].inc()
        if num_tokens:  # a request aborted before its first token has no latency to report
            self.e2e.observe(e2e)
            self.request_tpot.observe(decode_time / (num_tokens - 1) if num_tokens > 1 else 0.0)

    def set_state(self, num_running: int, num_waiting: int, kv_usage: float) -> None:
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.kv_usage.set(kv_usage)
