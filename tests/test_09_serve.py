"""`speclab serve` through the official openai client: outputs equal the offline engine's, errors are
OpenAI-shaped 400s, a client that leaves has its request aborted and its blocks freed, a full server
answers 503. The embedded target, short generations: the fast loop."""

import asyncio
import json
import time

import pytest
import requests

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install -e '.[serve]'")
pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")

from serve_helpers import NGRAM, TEMPLATE, metric, wait_idle  # noqa: E402

from speclab import LLM, SamplingParams  # noqa: E402
from speclab.data.prompts import load_prompts  # noqa: E402
from speclab.serve.launch import running_server  # noqa: E402

MODEL = "speclab-target"


@pytest.fixture(scope="module")
def url():
    with running_server(["--speculative-config", NGRAM, "--chat-template", TEMPLATE, "--max-num-seqs", "8"]) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline():
    llm = LLM(speculative_config=json.loads(NGRAM), max_num_seqs=8)
    llm.tokenizer.chat_template = TEMPLATE
    return llm


PROMPTS = load_prompts("copy")[:2] + load_prompts("code")[:2]


def stream_text(stream, chat=False):
    chunks = list(stream)
    body = [c for c in chunks if c.choices]
    text = "".join((c.choices[0].delta.content or "") if chat else c.choices[0].text for c in body)
    return text, body, chunks


def test_completions_greedy_equal_offline_generate(client, offline):
    params = SamplingParams(temperature=0, max_tokens=24)
    want = [o.outputs[0].text for o in offline.generate(PROMPTS, params, use_tqdm=False)]
    for prompt, w in zip(PROMPTS, want):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        assert r.choices[0].text == w
        assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == MODEL
        assert r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"
        text, body, chunks = stream_text(client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        assert text == w, "the stream's pieces must add up to the non-streamed text"
        assert body[-1].choices[0].finish_reason == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_streaming_sends_drafted_tokens_in_one_chunk(client, offline):
    """With n-gram speculation a copy-heavy prompt gets several tokens per engine step: fewer chunks than tokens."""
    prompt = PROMPTS[0]
    _, body, _ = stream_text(client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0,
                                                       stream=True))
    assert len(body) < 32


def test_token_id_prompt_and_default_max_tokens(client, offline):
    ids = offline.tokenizer.encode(PROMPTS[2])
    r = client.completions.create(model=MODEL, prompt=ids, temperature=0)
    want = offline.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert r.choices[0].text == want[0].outputs[0].text
    assert r.usage.completion_tokens == 16, "vLLM's completions default max_tokens is 16"


def test_chat_greedy_equal_offline_chat(client, offline):
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    want = offline.chat(msgs, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0].outputs[0].text
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    text, body, _ = stream_text(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20,
                                                               temperature=0, stream=True), chat=True)
    assert text == want
    assert body[0].choices[0].delta.role == "assistant", "a chat stream's first delta carries the role"
    assert body[0].object == "chat.completion.chunk"


def test_seeded_sampling_is_reproducible_and_equals_offline(client, offline):
    kw = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0.9, top_p=0.95)
    a = client.completions.create(seed=7, **kw).choices[0].text
    b = client.completions.create(seed=7, **kw).choices[0].text
    c, _, _ = stream_text(client.completions.create(seed=7, stream=True, **kw))
    d = client.completions.create(seed=8, **kw).choices[0].text
    want = offline.generate(PROMPTS[1], SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=7),
                            use_tqdm=False)[0].outputs[0].text
    assert a == b == c == want
    assert d != a, "another seed should give another sample (negative control)"


def test_extras_top_k_ignore_eos_stop_token_ids_and_stop_strings(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=24, temperature=0,
                                  extra_body={"top_k": 5, "ignore_eos": True, "unknown_field": 1})
    assert r.usage.completion_tokens == 24
    full = r.choices[0].text
    stop = full[5:8]
    s = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=24, temperature=0, stop=[stop])
    assert s.choices[0].text == full[:full.index(stop)] and s.choices[0].finish_reason == "stop"
    text, body, _ = stream_text(client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=24,
                                                          temperature=0, stop=stop, stream=True))
    assert text == full[:full.index(stop)] and body[-1].choices[0].finish_reason == "stop"
    first = offline.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    t = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=24, temperature=0,
                                  extra_body={"stop_token_ids": [first.token_ids[3]]})
    assert t.usage.completion_tokens == 4 and t.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kwargs, needle", [
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=10_000), "context"),
    (dict(n=2), "n=2"),
    (dict(logprobs=2), "logprobs"),
    (dict(stream_options={"include_usage": True}), "stream=True"),
    (dict(extra_body={"top_k": "many"}), "top_k"),
    (dict(seed=2**64), "int64"),
])
def test_bad_parameters_get_400_in_openai_error_shape(client, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="def f():", **kwargs)
    body = e.value.body
    assert e.value.status_code == 400 and body["code"] == 400 and body["type"] == "BadRequestError"
    assert needle in body["message"], body


def test_bad_chat_and_unknown_model(client, url):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt="x")
    assert "gpt-9" in e.value.body["message"]
    r = requests.post(url + "/v1/completions", data="not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400


def test_models_health_version_metrics(client, url):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert requests.get(url + "/health").status_code == 200
    assert "version" in requests.get(url + "/version").json()
    r = requests.get(url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    for name in ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
                 "time_per_output_token_seconds_bucket", "e2e_request_latency_seconds_bucket",
                 "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total"]:
        assert f"speclab:{name}{{" in r.text, f"speclab:{name} missing from /metrics"


def test_metrics_count_what_the_engine_counted(client, url):
    wait_idle(url)
    before = {n: metric(url, f"speclab:{n}") for n in ["generation_tokens_total", "prompt_tokens_total",
                                                        "spec_decode_num_draft_tokens_total"]}
    length = metric(url, "speclab:request_success_total", finished_reason="length")
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=20, temperature=0)
    wait_idle(url)
    assert metric(url, "speclab:generation_tokens_total") - before["generation_tokens_total"] == 20
    assert metric(url, "speclab:prompt_tokens_total") - before["prompt_tokens_total"] == r.usage.prompt_tokens
    assert metric(url, "speclab:request_success_total", finished_reason="length") == length + 1
    assert metric(url, "speclab:spec_decode_num_draft_tokens_total") > before["spec_decode_num_draft_tokens_total"]
    stats = url.server.llm.engine.stats
    assert metric(url, "speclab:spec_decode_num_accepted_tokens_total") == stats.num_accepted_tokens
    assert metric(url, "speclab:spec_decode_num_drafts_total") == stats.num_drafts
    assert metric(url, "speclab:spec_decode_num_accepted_tokens_per_pos_total", position="0") == \
        stats.num_accepted_tokens_per_pos[0]
    assert metric(url, "speclab:kv_cache_usage_perc") == 0.0


def test_latency_histograms_observe_per_request_and_per_step(client, url):
    """TTFT and E2E: one observation per request; ITL: one per engine step after the first, so with
    accepted drafts fewer observations than tokens (vLLM's semantics)."""
    wait_idle(url)
    names = ["time_to_first_token_seconds_count", "e2e_request_latency_seconds_count",
             "inter_token_latency_seconds_count", "time_per_output_token_seconds_count"]
    before = {n: metric(url, f"speclab:{n}") for n in names}
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=32, temperature=0)
    wait_idle(url)
    d = {n: metric(url, f"speclab:{n}") - before[n] for n in names}
    assert d["time_to_first_token_seconds_count"] == 1 and d["e2e_request_latency_seconds_count"] == 1
    assert d["inter_token_latency_seconds_count"] == d["time_per_output_token_seconds_count"]
    assert 1 <= d["inter_token_latency_seconds_count"] < r.usage.completion_tokens - 1, \
        "a copy-heavy prompt accepts drafts: fewer engine steps (ITL observations) than tokens"


def test_disconnect_mid_stream_aborts_and_frees_blocks(url):
    wait_idle(url)
    aborted = metric(url, "speclab:request_success_total", finished_reason="abort")
    body = {"model": MODEL, "prompt": PROMPTS[3], "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=30) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line)
        assert first.startswith(b"data: ")
        assert requests.get(url + "/debug/state").json()["num_tracked"] == 1
    state = wait_idle(url)  # every block back, nothing held
    assert state["num_running"] == 0 and state["num_waiting"] == 0
    assert metric(url, "speclab:request_success_total", finished_reason="abort") == aborted + 1
    assert metric(url, "speclab:kv_cache_usage_perc") == 0.0


def test_disconnect_while_waiting_for_a_whole_response_aborts(url):
    wait_idle(url)
    body = {"model": MODEL, "prompt": PROMPTS[3], "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()  # how long the whole answer takes here: the client leaves at a fifth of it
    requests.post(url + "/v1/completions", json=body, timeout=30).raise_for_status()
    whole = time.perf_counter() - start  # (a fixed 0.3 s stopped being long enough once the engine got faster)
    wait_idle(url)
    aborted = metric(url, "speclab:request_success_total", finished_reason="abort")
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(url + "/v1/completions", json=body, timeout=(5, whole / 5))
    wait_idle(url)
    assert metric(url, "speclab:request_success_total", finished_reason="abort") == aborted + 1


def test_full_server_answers_503_not_a_hang():
    # Three long streams fill the server: one running (--max-num-seqs 1) and two waiting behind it.
    # A stream's headers come back only after the server admitted its request, so when the posts
    # return all three are held, and the last cannot end for ~1200 decode steps: the fourth request
    # meets a full server whatever the machine's speed (one long stream alone could finish, on a
    # busy machine, before the client's next request got through).
    with running_server(["--max-num-seqs", "1", "--max-pending-requests", "3"]) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=30)
        body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                "stream": True}
        streams = [requests.post(url + "/v1/completions", json=body, stream=True, timeout=30) for _ in range(3)]
        try:
            assert all(r.status_code == 200 for r in streams)
            with pytest.raises(openai.InternalServerError) as e:
                client.completions.create(model=MODEL, prompt="def g():", max_tokens=4)
            assert e.value.status_code == 503 and "full" in e.value.body["message"]
            assert e.value.response.headers.get("retry-after") == "1"
        finally:
            for r in streams:
                r.close()
        wait_idle(url)
        assert client.completions.create(model=MODEL, prompt="def g():", max_tokens=4).usage.completion_tokens == 4


def test_api_key_guards_the_api():
    with running_server(["--api-key", "sekrit"]) as url:
        bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=url + "/v1", api_key="sekrit", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="def f():", max_tokens=2).usage.completion_tokens == 2
        assert requests.get(url + "/health").status_code == 200 and requests.get(url + "/metrics").status_code == 200


def test_concurrent_clients_are_batched_in_one_engine(url, offline):
    """Several clients at once: each gets exactly its offline greedy output (continuous batching is exact)."""
    params = SamplingParams(temperature=0, max_tokens=16)
    prompts = load_prompts("code")[:6]
    want = [o.outputs[0].text for o in offline.generate(prompts, params, use_tqdm=False)]

    async def run():
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=60)
        rs = await asyncio.gather(*[c.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0)
                                    for p in prompts])
        return [r.choices[0].text for r in rs]

    assert asyncio.run(run()) == want
    wait_idle(url)



@pytest.mark.parametrize("flags, needle", [
    (["--speculative-config", "{method: ngram}"], "not valid JSON"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 4}'],
     "num_speculative_tokens_per_batch_size"),
    (["--speculative-config", '{"method": "ngram"}'], "num_speculative_tokens must be provided"),
    (["--max-num-seqs", "0"], "max_num_seqs"),
])
def test_bad_serve_flags_exit_with_the_reason(flags, needle, capsys):
    from speclab.serve.cli import main
    with pytest.raises(SystemExit) as e:
        main(["serve", *flags])
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_a_stopped_server_releases_its_engine_and_model():
    """Memory: once a server in this process has stopped and its handles are dropped, nothing keeps its
    LLM (weights and KV pool) alive. FastAPI caches every endpoint function it classifies, module-wide, so
    endpoints that closed over the server kept each app's engine for the life of the process."""
    import gc
    import weakref

    with running_server(["--max-num-seqs", "2"]) as u:
        r = requests.post(u + "/v1/completions", json={"model": MODEL, "prompt": "def f():", "max_tokens": 2},
                          timeout=60)
        assert r.status_code == 200, r.text
        llm = weakref.ref(u.server.llm)
        model = weakref.ref(u.server.llm.engine.model)
        del u
    gc.collect()
    assert llm() is None and model() is None, "something still holds the stopped server's LLM or its model"
