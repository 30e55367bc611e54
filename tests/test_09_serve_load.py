"""A bounded load test: 32 concurrent clients on one local server lose no request, each gets its
offline greedy output, and the server ends with every KV block free. Marked slow (~10-30 s here)."""

import asyncio
import json

import pytest

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install -e '.[serve]'")
pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")

from serve_helpers import NGRAM, metric, wait_idle  # noqa: E402

from speclab import LLM, SamplingParams  # noqa: E402
from speclab.data.prompts import load_prompts  # noqa: E402
from speclab.serve.launch import running_server  # noqa: E402

CLIENTS, PER_CLIENT, MAX_TOKENS = 32, 3, 12


@pytest.mark.slow
def test_32_concurrent_clients_lose_nothing_and_free_every_block():
    prompts = [p for kind in ("code", "copy", "prose") for p in load_prompts(kind)]
    jobs = [(c, prompts[(c * PER_CLIENT + j) % len(prompts)]) for c in range(CLIENTS) for j in range(PER_CLIENT)]
    # max_num_seqs 16 < 32 clients: requests also wait in the queue, and the pool is small enough to preempt
    with running_server(["--speculative-config", NGRAM, "--max-num-seqs", "16", "--num-gpu-blocks-override", "40",
                         "--max-pending-requests", "64"]) as url:

        async def client(c, mine, streaming):
            api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=120)
            out = []
            for p in mine:
                if streaming:
                    s = await api.completions.create(model="speclab-target", prompt=p, max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True)
                    out.append("".join([ch.choices[0].text async for ch in s if ch.choices]))
                else:
                    r = await api.completions.create(model="speclab-target", prompt=p, max_tokens=MAX_TOKENS,
                                                     temperature=0)
                    out.append(r.choices[0].text)
            return out

        async def run():
            return await asyncio.wait_for(asyncio.gather(*[
                client(c, [p for cc, p in jobs if cc == c], streaming=c % 2 == 0) for c in range(CLIENTS)]),
                timeout=60)

        got = asyncio.run(run())
        state = wait_idle(url)
        assert state["num_running"] == state["num_waiting"] == 0
        assert metric(url, "speclab:kv_cache_usage_perc") == 0.0
        finished = sum(metric(url, "speclab:request_success_total", finished_reason=r) for r in ("stop", "length"))
        assert finished == len(jobs), f"{finished} of {len(jobs)} requests finished"
        preemptions = url.server.llm.engine.scheduler.num_preemptions

    offline = LLM(speculative_config=json.loads(NGRAM))
    want = {p: o.outputs[0].text for p, o in zip(
        prompts, offline.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False))}
    for c in range(CLIENTS):
        mine = [p for cc, p in jobs if cc == c]
        assert got[c] == [want[p] for p in mine], f"client {c} got another output than offline greedy"
    print(f"\n  {len(jobs)} requests from {CLIENTS} clients, {preemptions} preemptions")
