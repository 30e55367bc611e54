"""A real Prometheus scrapes `speclab serve`: the course's PromQL for the acceptance rate and the mean
acceptance length, evaluated by Prometheus, equals the ratios of the server's own counters.

Needs Debian's `prometheus` on PATH (CI installs it; `apt-get install prometheus`); skips without
it. Our own instance: its own config, port and storage in a temp dir (the package's service, if
any, is left alone)."""

import shutil
import socket
import subprocess
import time

import pytest
import requests

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")
openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install -e '.[serve]'")

from serve_helpers import NGRAM, metric, wait_idle  # noqa: E402

from speclab.data.prompts import load_prompts  # noqa: E402
from speclab.serve.launch import running_server  # noqa: E402

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (apt-get install prometheus; "
                                                           "CI installs it)")
ACCEPTANCE_RATE = ("increase(speclab:spec_decode_num_accepted_tokens_total[1h]) / "
                   "increase(speclab:spec_decode_num_draft_tokens_total[1h])")
MEAN_ACCEPTANCE_LENGTH = ("1 + increase(speclab:spec_decode_num_accepted_tokens_total[1h]) / "
                          "increase(speclab:spec_decode_num_drafts_total[1h])")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(prom: str, expr: str) -> list:
    r = requests.get(prom + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", body
    return body["data"]["result"]


def wait_until(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


@pytest.fixture
def prometheus_for(tmp_path):
    procs = []

    def start(target: str) -> str:
        port = free_port()
        (tmp_path / "p.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs: [{{job_name: speclab, static_configs: [{{targets: ['{target}']}}]}}]\n")
        log = open(tmp_path / "prometheus.log", "w")
        procs.append(subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'p.yml'}",
                                       f"--storage.tsdb.path={tmp_path / 'data'}",
                                       f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log))
        url = f"http://127.0.0.1:{port}"

        def ready():
            try:
                return requests.get(url + "/-/ready", timeout=1).status_code == 200
            except requests.ConnectionError:
                assert procs[-1].poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                return False
        wait_until(ready, 30, "prometheus to be ready")
        return url

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.slow
def test_promql_acceptance_equals_the_servers_counters(prometheus_for):
    with running_server(["--speculative-config", NGRAM]) as url:
        prom = prometheus_for(url.removeprefix("http://"))
        # a first scrape before any traffic: increase() then measures this test's traffic from zero
        wait_until(lambda: query(prom, "speclab:spec_decode_num_drafts_total"), 30, "a first scrape")
        client = openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=60)
        for p in load_prompts("copy")[:4] + load_prompts("code")[:2]:
            client.completions.create(model="speclab-target", prompt=p, max_tokens=32, temperature=0)
        wait_idle(url)
        accepted = metric(url, "speclab:spec_decode_num_accepted_tokens_total")
        drafted = metric(url, "speclab:spec_decode_num_draft_tokens_total")
        drafts = metric(url, "speclab:spec_decode_num_drafts_total")
        assert drafted > 0 and 0 < accepted < drafted, "the traffic must draft and accept some (and not all) tokens"
        stats = url.server.llm.engine.stats
        assert (accepted, drafted, drafts) == (stats.num_accepted_tokens, stats.num_draft_tokens, stats.num_drafts)
        # wait until Prometheus has scraped the final counters, then ask it
        wait_until(lambda: [r for r in query(prom, "speclab:spec_decode_num_draft_tokens_total")
                            if float(r["value"][1]) == drafted], 30, "a scrape of the final counters")
        rate = float(query(prom, ACCEPTANCE_RATE)[0]["value"][1])
        length = float(query(prom, MEAN_ACCEPTANCE_LENGTH)[0]["value"][1])
        # increase() and rate() extrapolate to the window's edges, but by the same factor for series
        # scraped at the same instants and starting from 0, so their ratios are the counters' ratios
        assert rate == pytest.approx(accepted / drafted, rel=1e-9), (rate, accepted / drafted)
        assert length == pytest.approx(1 + accepted / drafts, rel=1e-9), (length, 1 + accepted / drafts)
        as_rates = float(query(prom, ACCEPTANCE_RATE.replace("increase(", "rate("))[0]["value"][1])
        assert as_rates == pytest.approx(accepted / drafted, rel=1e-9), "rate(accepted) / rate(draft tokens)"
        assert rate == pytest.approx(stats.acceptance_rate) and length == pytest.approx(stats.mean_acceptance_length)
        # per position, as vLLM's dashboards chart it
        per_pos = query(prom, "increase(speclab:spec_decode_num_accepted_tokens_per_pos_total[1h]) / ignoring(position)"
                              " group_left increase(speclab:spec_decode_num_drafts_total[1h])")
        got = {int(r["metric"]["position"]): float(r["value"][1]) for r in per_pos}
        assert got == pytest.approx(dict(enumerate(stats.acceptance_per_pos())), rel=1e-9)
