"""Speculative-decoding counters, named as vLLM names them.

vLLM (v1/spec_decode/metrics.py) counts, per verification: one draft, its number of draft
tokens, its number of accepted tokens, and which positions were accepted. From those:
  acceptance rate        = accepted tokens / draft tokens
  alpha (Leviathan)      = accepted tokens / draft positions actually tested
  mean acceptance length = 1 + accepted tokens / drafts   (tokens per target forward)
The engine exports the same counters under a `speclab:` prefix.
"""

from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    """Running totals over every verification step.

    Attributes:
        num_speculative_tokens: k, the largest draft that will be observed (length of the per-position list).
        num_drafts: verification steps that had at least one draft token.
        num_draft_tokens: drafted tokens, summed over steps.
        num_accepted_tokens: accepted drafted tokens (recovered and bonus tokens not counted).
        num_accepted_tokens_per_pos: position i counts the steps whose draft i was accepted.
        num_positions_tested: draft positions the verifier actually tested (it stops at the first
            rejection): min(accepted + 1, drafted) per step. Not a vLLM counter; it gives alpha.
    """

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_positions_tested: int = 0

    def __post_init__(self):
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_speculative_tokens

    def reset(self) -> None:
        """Zero every counter (e.g. after a warm-up run)."""
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = self.num_positions_tested = 0
        self.num_accepted_tokens_per_pos = [0] * self.num_speculative_tokens

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Record one verification: k drafted, the first `num_accepted_tokens` of them kept."""
        if not 0 <= num_accepted_tokens <= num_draft_tokens <= self.num_speculative_tokens:
            raise ValueError(f"need 0 <= accepted ({num_accepted_tokens}) <= drafted ({num_draft_tokens})"
                             f" <= num_speculative_tokens ({self.num_speculative_tokens})")
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        self.num_positions_tested += min(num_accepted_tokens + 1, num_draft_tokens)
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / draft tokens (0 when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts: tokens emitted per verification step, bonus included."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def alpha(self) -> float:
        """Leviathan's alpha: the probability that a drafted token *that is verified* is accepted.

        Verification stops at the first rejection, so position i is only tested when positions
        before it were accepted: alpha = accepted / positions tested. (acceptance_rate divides
        by all drafted tokens instead, and so understates alpha for gamma > 1.)
        """
        return self.num_accepted_tokens / self.num_positions_tested if self.num_positions_tested else 0.0

    def acceptance_per_pos(self) -> list[float]:
        """Fraction of drafts whose position i was accepted (unconditional, as vLLM reports it)."""
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.num_accepted_tokens_per_pos]

    def as_dict(self) -> dict:
        """The counters and the two derived rates, keyed by vLLM's metric names (no prefix)."""
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
        }


def prometheus_text(stats: SpecDecodingStats, prefix: str = "speclab") -> str:
    """The counters in Prometheus' text exposition format, as vLLM exports them (`_total` suffix,
    per-position counts labelled by `position`)."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    for name, doc in [("num_drafts", "Number of spec decoding drafts."),
                      ("num_draft_tokens", "Number of draft tokens."),
                      ("num_accepted_tokens", "Number of accepted tokens.")]:
        Counter(f"{prefix}:spec_decode_{name}", doc, registry=registry).inc(getattr(stats, name))
    per_pos = Counter(f"{prefix}:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                      ["position"], registry=registry)
    for i, n in enumerate(stats.num_accepted_tokens_per_pos):
        per_pos.labels(position=str(i)).inc(n)
    return generate_latest(registry).decode()


# ----------------------------------------------------------------------------------------------
# LLM.get_metrics(): vLLM's shape (vllm/v1/metrics/reader.py), and one helper for either engine's list


@dataclass
class Metric:
    """One metric of `LLM.get_metrics()`: a name (with its engine's prefix) and its labels."""
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    """A monotonically increasing integer counter."""
    value: int


@dataclass
class Vector(Metric):
    """An ordered array of counters (vLLM's one use: accepted tokens per draft position)."""
    values: list[int]


SPEC_DECODE_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def metrics_list(stats: SpecDecodingStats, prefix: str = "speclab", labels: dict | None = None) -> list[Metric]:
    """The spec-decode counters as vLLM's `LLM.get_metrics()` lists them: three Counters and the
    per-position Vector, named `{prefix}:spec_decode_*`."""
    labels = dict(labels or {"engine": "0"})
    out: list[Metric] = [Counter(f"{prefix}:spec_decode_{n}", dict(labels), getattr(stats, n))
                         for n in SPEC_DECODE_COUNTERS]
    out.append(Vector(f"{prefix}:spec_decode_num_accepted_tokens_per_pos", dict(labels),
                      list(stats.num_accepted_tokens_per_pos)))
    return out


def spec_decode_counters(metrics) -> dict:
    """Either engine's `llm.get_metrics()` list -> the dict of counters the lessons use.

    Reads speclab's (`speclab:spec_decode_*`) and vLLM's (`vllm:spec_decode_*`) metric objects alike
    (anything with `name`, `labels` and `value` or `values`), summed over engines/labels, and adds the
    two rates. Without speculation (no spec-decode metrics in the list) every counter is 0.
    Returns: {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos",
    "acceptance_rate", "mean_acceptance_length"}, as `SpecDecodingStats.as_dict()`.
    """
    if isinstance(metrics, dict):
        raise TypeError("spec_decode_counters takes the list that llm.get_metrics() returns, not a dict "
                        "(get_metrics() now returns metric objects, as vLLM's does)")
    totals = {n: 0 for n in SPEC_DECODE_COUNTERS}
    per_pos: list[int] = []
    for m in metrics:
        name = m.name.partition(":")[2]
        if not name.startswith("spec_decode_"):
            continue                           # vLLM lists its other metrics too
        name = name.removeprefix("spec_decode_")
        if name in totals:
            totals[name] += int(m.value)
        elif name == "num_accepted_tokens_per_pos":
            values = list(m.values)
            per_pos = [a + b for a, b in zip(per_pos + [0] * len(values), values + [0] * len(per_pos))]
    stats = SpecDecodingStats(num_speculative_tokens=len(per_pos), num_accepted_tokens_per_pos=per_pos, **totals)
    return stats.as_dict()
