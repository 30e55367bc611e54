"""Serving side by side: `speclab serve` and real `vllm serve`, each driven by `speclab bench serve` and
`vllm bench serve` (`python -m speclab.bench serve-vs-vllm`), and the lessons' one-line changes to vLLM.

The end-to-end test runs a tiny version of the benchmark (4 held-out chats x 8 tokens, n-gram on both
servers, one round; about 2 minutes, most of it vLLM's eager start-up) and checks that both clients
parse both servers' results: request counts, no errors, token totals, acceptance. It skips with a
reason without `make vllm` (and without the real model's wheel). Speed is never asserted.
The other tests need neither: the harness's arithmetic on made-up results, the client's reading of
vLLM's metric names, and the crosswalk's table against the lessons' `# vLLM:` comments.
"""

import json
import re
import sys
from pathlib import Path

import pytest

from speclab.bench import cli as bench
from speclab.bench import serve as bench_serve
from speclab.bench import serve_vs_vllm as svv
from speclab.vllm_venv import skip_reason
from tests.helpers import needs_smollm2_wheel

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = {"03": "03_ngram_proposer.ipynb", "08": "08_eagle_mtp_medusa.ipynb", "09": "09_serving.ipynb"}
BUILDS_LLM = re.compile(r"(?<![\w.])LLM\(")
N, LEN = 4, 8


# ------------------------------------------------------------------------------------------------
# the lessons' one-line changes: one table in the crosswalk, quoted beside each cell


def crosswalk_changes() -> dict[str, set[str]]:
    """lesson -> the changes in the crosswalk's "Lesson cells that build an LLM" table (backticks dropped)."""
    text = (ROOT / "notebooks" / "vllm_crosswalk.md").read_text()
    section = text.split("### Lesson cells that build an `LLM`, under vLLM", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 3 and cells[0].isdigit():
            out.setdefault(cells[0], set()).add(cells[2].replace("`", ""))
    return out


def code_cells(lesson: str) -> list[list[str]]:
    nb = json.loads((ROOT / "notebooks" / NOTEBOOKS[lesson]).read_text())
    return [("".join(c["source"])).splitlines() for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("lesson", sorted(NOTEBOOKS))
def test_every_cell_that_builds_an_llm_shows_its_vllm_change_from_the_crosswalk(lesson):
    table = crosswalk_changes().get(lesson, set())
    assert table, f"the crosswalk's table has no rows for lesson {lesson}"
    quoted = set()
    for lines in code_cells(lesson):
        builds = [i for i, line in enumerate(lines)
                  if BUILDS_LLM.search(line) and not line.lstrip().startswith(("#", "from", "import"))]
        comments = {i: line.split("# vLLM:", 1)[1].strip() for i, line in enumerate(lines)
                    if line.lstrip().startswith("# vLLM:")}
        for i in builds:
            assert i - 1 in comments, (f"lesson {lesson}: the cell line {lines[i].strip()!r} builds an LLM without a "
                                       f"`# vLLM:` comment on the line above it (copy its row from vllm_crosswalk.md)")
        for text in comments.values():
            assert text in table, (f"lesson {lesson}: `# vLLM: {text}` is not in vllm_crosswalk.md's table (the table "
                                   f"is the one source: change it there and copy it here)")
            quoted.add(text)
    assert quoted == table, f"lesson {lesson}: crosswalk rows no cell quotes: {sorted(table - quoted)}"


def test_the_check_sees_a_missing_comment_and_an_edited_one(monkeypatch):
    """Negative control: a cell whose comment was dropped or reworded fails the check above."""
    real = code_cells

    def dropped(lesson):
        return [[x for x in lines if not x.lstrip().startswith("# vLLM:")] for lines in real(lesson)]

    def reworded(lesson):
        return [[x.replace("# vLLM:", "# vLLM: (edited)") for x in lines] for lines in real(lesson)]

    for fake in (dropped, reworded):
        monkeypatch.setattr(sys.modules[__name__], "code_cells", fake)
        with pytest.raises(AssertionError):
            test_every_cell_that_builds_an_llm_shows_its_vllm_change_from_the_crosswalk("09")


# ------------------------------------------------------------------------------------------------
# the harness and the client, without servers


def test_serve_vs_vllm_is_a_bench_subcommand_with_its_own_flags(capsys):
    with pytest.raises(SystemExit) as done:
        bench.main(["serve-vs-vllm", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and "--repeats" in out and "--guidellm" in out


def test_both_servers_hold_kv_for_the_same_tokens(tmp_path):
    for engine, block in (("speclab", svv.SPECLAB_BLOCK), ("vllm", svv.VLLM_CPU_BLOCK)):
        cmd, env = svv.Server.command(engine, tmp_path, ["--host", "127.0.0.1"], threads=1)
        blocks = int(cmd[cmd.index("--num-gpu-blocks-override") + 1])
        assert blocks * block == svv.KV_TOKENS == 4096, engine
    assert "--block-size" not in cmd, "vLLM's CPU block size is its default, 128 (its attention takes multiples of 32)"


def test_low_memory_runs_vllm_s_worker_inside_its_engine_process(tmp_path):
    for low in (False, True):
        _, env = svv.Server.command("vllm", tmp_path, ["--host", "127.0.0.1"], threads=1, low_memory=low)
        assert (env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0") == low, "the uni executor only under --low-memory"
    _, env = svv.Server.command("speclab", tmp_path, ["--host", "127.0.0.1"], threads=1, low_memory=True)
    assert env.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0", "speclab's server takes no vLLM setting"


def test_low_memory_starts_one_server_at_a_time(monkeypatch, tmp_path):
    """Each server is stopped before the next one starts, and every round of each still runs."""
    up, events = set(), []

    class Fake:
        def __init__(self, engine, config, model_dir, args, log_dir):
            assert not up, f"{engine} started while {up} was still up"
            self.engine, self.startup_s, self.url = engine, 1.0, "http://x"
            up.add(engine)
            events.append(("start", engine))

        def wait_ready(self, timeout):
            pass

        def stop(self):
            up.discard(self.engine)

    monkeypatch.setattr(svv, "Server", Fake)
    monkeypatch.setattr(svv, "run_client", lambda client, server, *a: events.append(("run", server.engine)) or {
        "server_acceptance_rate": None, "completed": 1, "failed": 0, "output_throughput": 1.0,
        "median_itl_ms": 1.0, "load_average": "0"})
    args = svv.parse_args(["--repeats", "2", "--clients", "speclab", "--low-memory"])
    runs = svv.run_config("plain", args, tmp_path, tmp_path, tmp_path / "d.json", {})
    assert [r["server"] for r in runs] == ["speclab", "speclab", "vllm", "vllm"] and not up
    assert events == [("start", "speclab"), ("run", "speclab"), ("run", "speclab"),
                      ("start", "vllm"), ("run", "vllm"), ("run", "vllm")]


def test_speclab_bench_serve_reads_the_spec_decode_counters_of_either_server(monkeypatch):
    """vLLM's /metrics names them vllm:spec_decode_*; speclab's client read only speclab:* before."""
    scrape = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 5.0
other:spec_decode_num_drafts_total 99.0
"""
    import requests

    monkeypatch.setattr(requests, "get", lambda *a, **k: type("R", (), {"text": scrape})())
    got = bench_serve.spec_counters("http://x")
    assert got == {"num_drafts": 10.0, "num_draft_tokens": 40.0, "num_accepted_tokens": 12.0,
                   "num_accepted_tokens_per_pos": {0: 7.0, 1: 5.0}}, "another prefix must not be read"
    assert bench_serve.spec_counters.__doc__ and "vllm:" in bench_serve.spec_counters.__doc__


def run(config, server, client, rnd, tput, acc=None):
    return {"config": config, "server": server, "client": client, "round": rnd, "completed": N, "failed": 0,
            "total_input_tokens": 448, "total_output_tokens": N * LEN, "output_throughput": tput,
            "request_throughput": tput / LEN, "median_ttft_ms": 1.0, "median_tpot_ms": 2.0, "median_itl_ms": 2.0,
            "server_acceptance_rate": acc, "server_mean_acceptance_length": None, "client_acceptance_rate": acc}


def test_rows_are_medians_and_ratios_are_per_round():
    runs = [run("plain", "speclab", "vllm", 0, 10.0), run("plain", "vllm", "vllm", 0, 30.0),
            run("plain", "speclab", "vllm", 1, 20.0), run("plain", "vllm", "vllm", 1, 20.0),
            run("plain", "speclab", "vllm", 2, 10.0), run("plain", "vllm", "vllm", 2, 40.0),
            run("ngram", "speclab", "vllm", 0, 15.0, 0.5), run("ngram", "speclab", "vllm", 1, 30.0, 0.7),
            run("ngram", "speclab", "vllm", 2, 20.0, 0.6)]
    rows = {(r["config"], r["server"]): r for r in svv.medians(runs)}
    assert rows[("plain", "vllm")]["output_throughput"] == 30.0
    assert rows[("plain", "vllm")]["vs_speclab_server"] == 3.0       # per-round 3.0, 1.0, 4.0 -> median 3.0
    assert rows[("plain", "speclab")]["vs_speclab_server"] is None
    assert rows[("ngram", "speclab")]["vs_plain"] == 1.5             # per round 1.5, 1.5, 2.0
    assert rows[("ngram", "speclab")]["server_acceptance_rate"] == 0.6
    assert rows[("ngram", "speclab")]["completed"] == [N] * 3 and rows[("ngram", "speclab")]["failed"] == 0


def test_both_result_formats_parse_to_the_same_keys():
    vllm_json = {"completed": 4, "failed": 0, "duration": 2.0, "total_input_tokens": 448, "total_output_tokens": 32,
                 "request_throughput": 2.0, "output_throughput": 16.0, "median_ttft_ms": 5.0, "median_tpot_ms": 6.0,
                 "median_itl_ms": 6.0, "median_e2el_ms": 50.0, "errors": ["", ""], "spec_decode_acceptance_rate": 25.0}
    row = svv.parse_vllm_keys(vllm_json)
    assert row["client_acceptance_rate"] == 0.25 and row["errors"] == [] and row["failed"] == 0
    stat = lambda v: {"successful": {"median": v, "total_sum": v * 4, "percentiles": {"p99": v}}}  # noqa: E731
    guide = {"benchmarks": [{"duration": 2.0, "metrics": {
        "request_totals": {"successful": 4, "errored": 1, "incomplete": 0}, "output_token_count": stat(8.0),
        "prompt_token_count": stat(112.0), "time_to_first_token_ms": stat(5.0), "time_per_output_token_ms": stat(6.0),
        "inter_token_latency_ms": stat(6.0), "request_latency": stat(0.05)}}]}
    g = svv.parse_guidellm(guide)
    assert set(row) <= set(g) | {"errors"}
    assert g["completed"] == 4 and g["failed"] == 1 and g["total_output_tokens"] == 32.0
    assert g["output_throughput"] == 16.0 and g["median_e2el_ms"] == 50.0 and g["p99_ttft_ms"] == 5.0


# ------------------------------------------------------------------------------------------------
# end to end: both servers, both clients


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("serve_vs_vllm") / "tiny.json"
    data = svv.main(["--configs", "ngram", "--clients", "speclab", "vllm", "--num-prompts", str(N),
                     "--output-len", str(LEN), "--max-concurrency", "2", "--repeats", "1", "--low-memory",
                     "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == data["rows"]
    return data


@pytest.mark.slow
@pytest.mark.vllm
@needs_smollm2_wheel()
def test_both_clients_parse_both_servers(tiny_run):
    rows = {(r["server"], r["client"]): r for r in tiny_run["rows"]}
    assert set(rows) == {(s, c) for s in ("speclab", "vllm") for c in ("speclab", "vllm")}
    for (server, client), r in rows.items():
        where = f"{client} client against {server} serve"
        run_ = next(x for x in tiny_run["runs"] if (x["server"], x["client"]) == (server, client))
        assert r["completed"] == [N] and r["failed"] == 0 and not run_["errors"], f"{where}: {run_['errors']}"
        assert r["total_output_tokens"] == N * LEN, f"{where}: ignore_eos should give exactly {LEN} tokens each"
        assert r["output_throughput"] > 0 and r["median_ttft_ms"] > 0, where
    for server in ("speclab", "vllm"):
        a, b = rows[(server, "speclab")], rows[(server, "vllm")]
        assert a["total_input_tokens"] == b["total_input_tokens"] == tiny_run["settings"]["prompt_tokens"], (
            f"{server}: the two clients sent different prompt tokens ({a['total_input_tokens']} chat-rendered by "
            f"the server vs {b['total_input_tokens']} rendered here): the same chats must be the same token ids")


@pytest.mark.slow
@pytest.mark.vllm
@needs_smollm2_wheel()
def test_acceptance_is_read_from_both_servers(tiny_run):
    for run_ in tiny_run["runs"]:
        where = f"{run_['client']} client against {run_['server']} serve"
        assert run_["server_counters"]["num_drafts"] > 0, f"{where}: the n-gram server drafted nothing"
        assert 0 <= run_["server_acceptance_rate"] <= 1, where
        if run_["client"] == "speclab":   # it reads speclab:* and vllm:* counters (its warm-up request excluded)
            assert 0 < run_["client_num_drafts"] <= run_["server_counters"]["num_drafts"], where
            assert 0 <= run_["client_acceptance_rate"] <= 1, where
    vllm_on_vllm = next(r for r in tiny_run["runs"] if (r["server"], r["client"]) == ("vllm", "vllm"))
    assert 0 < vllm_on_vllm["client_num_drafts"] <= vllm_on_vllm["server_counters"]["num_drafts"]
    vllm_on_speclab = next(r for r in tiny_run["runs"] if (r["server"], r["client"]) == ("speclab", "vllm"))
    assert vllm_on_speclab["client_acceptance_rate"] is None, (
        "vllm bench serve now reports speclab serve's acceptance: it reads only vllm:spec_decode_* lines in 0.32.0; "
        "update lesson 09's section 8 and the crosswalk, which say it does not")
