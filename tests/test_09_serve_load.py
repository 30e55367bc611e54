"""A bounded load test on one local server (127.0.0.1 only): 40 concurrent streaming clients mixing
valid requests, bad-parameter requests, disconnects and oversize bodies.

It ends with every valid request's text equal to offline greedy, every KV block free, and the
metrics' counts equal to what the clients saw: finished requests by finish_reason, aborts = the
clients that left, no engine work for refused requests, preemptions as the scheduler counted them.
Bounded: 40 clients x 3 requests, 12 tokens each, a 120 s cap. Marked slow (~20-60 s on 2 cores).
"""

import asyncio
import json

import pytest

httpx = pytest.importorskip("httpx2", reason="the serve extra is not installed: pip install -e '.[serve]'")
pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")

from serve_helpers import NGRAM, metric, wait_idle  # noqa: E402

from speclab import LLM, SamplingParams  # noqa: E402
from speclab.data.prompts import load_prompts  # noqa: E402
from speclab.serve.launch import running_server  # noqa: E402

CLIENTS, PER_CLIENT, MAX_TOKENS = 40, 3, 12
KINDS = ("valid", "valid", "bad", "disconnect", "oversize")  # client c is KINDS[c % 5]
BAD = [{"temperature": 1e300}, {"top_p": 1e-50}, {"seed": 2**64}, {"max_tokens": 10**30}, {"logit_bias": {"1": 5}},
       {"min_tokens": 4}, {"n": 2}, {"stop_token_ids": [10**30]}, {"prompt": [1, "x"]}]
MODEL = "speclab-target"


async def stream(api, body):
    """POST a streaming completion; returns (status, text, finish_reason, usage) as the client saw them."""
    text, finish, used = "", None, None
    async with api.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                           "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r.json()["error"], None, None
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                text += chunk["choices"][0]["text"]
                finish = chunk["choices"][0]["finish_reason"] or finish
            if chunk.get("usage"):
                used = chunk["usage"]["completion_tokens"]
    return 200, text, finish, used


async def client(api, c, prompts, seen):
    kind = KINDS[c % len(KINDS)]
    out = []
    for j, p in enumerate(prompts):
        valid = {"model": MODEL, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0}
        if kind == "valid":
            status, text, finish, used = await stream(api, valid)
            assert status == 200, text
            seen["finish"][finish] = seen["finish"].get(finish, 0) + 1
            seen["tokens"] += used
            out.append(text)
        elif kind == "bad":
            bad = BAD[(c + j) % len(BAD)]
            status, err, _, _ = await stream(api, {**valid, **bad})
            assert status == 400 and err["code"] == 400, (bad, err)
            seen["refused"] += 1
        elif kind == "oversize":
            status, err, _, _ = await stream(api, {**valid, "prompt": "x" * 1_200_000})
            assert status == 413 and err["code"] == 413, err
            seen["refused"] += 1
        else:  # read the first chunk of a long stream, then leave
            async with api.stream("POST", "/v1/completions", json={**valid, "max_tokens": 200, "ignore_eos": True,
                                                                   "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        break
            seen["aborted"] += 1
    return out


@pytest.mark.slow
def test_40_mixed_streaming_clients_lose_nothing_and_the_metrics_match_the_clients():
    prompts = [p for kind in ("code", "copy", "prose") for p in load_prompts(kind)]
    jobs = {c: [prompts[(c * PER_CLIENT + j) % len(prompts)] for j in range(PER_CLIENT)] for c in range(CLIENTS)}
    seen = {"finish": {}, "tokens": 0, "refused": 0, "aborted": 0}
    # max_num_seqs 16 < 40 clients: requests also wait in the queue, and the pool is small enough to preempt
    with running_server(["--speculative-config", NGRAM, "--max-num-seqs", "16", "--num-gpu-blocks-override", "40",
                         "--max-pending-requests", "64"]) as url:
        wait_idle(url)
        reasons = ("stop", "length", "abort", "error")
        before = {r: metric(url, "speclab:request_success_total", finished_reason=r) for r in reasons}
        gen0, ttft0 = metric(url, "speclab:generation_tokens_total"), \
            metric(url, "speclab:time_to_first_token_seconds_count")

        async def run():
            limits = httpx.Limits(max_connections=CLIENTS + 8)
            async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as api:
                return await asyncio.wait_for(asyncio.gather(*[client(api, c, jobs[c], seen) for c in range(CLIENTS)]),
                                              timeout=120)

        got = asyncio.run(run())
        state = wait_idle(url)
        assert state["num_running"] == state["num_waiting"] == 0 and state["alive"]
        assert metric(url, "speclab:kv_cache_usage_perc") == 0.0
        delta = {r: metric(url, "speclab:request_success_total", finished_reason=r) - before[r] for r in reasons}
        generated = metric(url, "speclab:generation_tokens_total") - gen0
        first_tokens = metric(url, "speclab:time_to_first_token_seconds_count") - ttft0
        preemptions = url.server.llm.engine.scheduler.num_preemptions
        assert metric(url, "speclab:num_preemptions_total") == preemptions

    num_valid = sum(len(jobs[c]) for c in range(CLIENTS) if KINDS[c % len(KINDS)] == "valid")
    assert sum(seen["finish"].values()) == num_valid
    assert {r: delta[r] for r in ("stop", "length")} == {r: seen["finish"].get(r, 0) for r in ("stop", "length")}
    assert delta["abort"] == seen["aborted"] and delta["error"] == 0, (delta, seen)
    # the refused requests never reached the engine: every engine request is a valid one or a disconnect
    assert first_tokens == num_valid + seen["aborted"]
    # tokens: exactly what the valid clients were told, plus what the leavers got before their abort
    assert seen["tokens"] <= generated <= seen["tokens"] + 200 * seen["aborted"]

    offline = LLM(speculative_config=json.loads(NGRAM))
    want = {p: o.outputs[0].text for p, o in zip(
        prompts, offline.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False))}
    for c in range(CLIENTS):
        if KINDS[c % len(KINDS)] == "valid":
            assert got[c] == [want[p] for p in jobs[c]], f"client {c} got another output than offline greedy"
    print(f"\n  {CLIENTS} clients, {num_valid} valid requests, {seen['refused']} refused, {seen['aborted']} "
          f"disconnects, {preemptions} preemptions")
