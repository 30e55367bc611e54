"""Issue 19, over HTTP: one bad request never kills the server.

D10's values beside an in-flight valid stream (the bad one gets a 400 or is honoured, the valid one
completes with its offline output, /health stays 200); every field the server cannot honour gets a
400 naming it; a multi-megabyte body is refused in bounded time while a concurrent stream keeps
receiving chunks; one error shape everywhere; the client's finish_reason and token count are what
the metrics count; --max-model-len; loopback and API-key defaults.
"""

import json
import os
import threading
import time

import pytest
import requests

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install -e '.[serve]'")
pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")

from serve_helpers import NGRAM, TEMPLATE, metric, wait_idle  # noqa: E402

from speclab import LLM, SamplingParams  # noqa: E402
from speclab.serve.launch import running_server  # noqa: E402
from speclab.serve.protocol import UNSUPPORTED  # noqa: E402

MODEL = "speclab-target"
PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def url():
    with running_server(["--speculative-config", NGRAM, "--chat-template", TEMPLATE, "--max-num-seqs", "8"]) as u:
        yield u


@pytest.fixture(scope="module")
def offline():
    return LLM(speculative_config=json.loads(NGRAM), max_num_seqs=8)


def post(url, body, **kw):
    return requests.post(url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **body},
                         timeout=kw.pop("timeout", 60), **kw)


def assert_error(r, status, *needles, param="?"):
    """The one error shape, with the status as code and a message that names what was wrong."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status, err
    for n in needles:
        assert n in err["message"], err
    if param != "?":
        assert err["param"] == param, err
    assert "/work" not in err["message"] and "site-packages" not in err["message"], "no paths of the machine"
    return err


class Stream(threading.Thread):
    """A long greedy stream read in the background, timing the gap between chunks."""

    def __init__(self, url, max_tokens=300):
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.text, self.gaps, self.finish, self.started = "", [], None, threading.Event()

    def run(self):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": self.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        last = None
        with requests.post(self.url + "/v1/completions", json=body, stream=True, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                now = time.monotonic()
                if last is not None:
                    self.gaps.append(now - last)
                last = now
                choice = json.loads(line[6:])["choices"][0]
                self.text += choice["text"]
                self.finish = choice["finish_reason"] or self.finish
                self.started.set()


def start_stream(url, max_tokens=300):
    s = Stream(url, max_tokens)
    s.start()
    assert s.started.wait(60), "the valid stream never started"
    return s


# ----------------------------------------------------------------------------------------------
# D10: values that used to crash the step, beside a request in flight


D10 = [  # (field, value, "400 naming the field" or None when the value is honoured)
    ("temperature", 1e300, "temperature"),
    ("top_p", 1e-50, "top_p"),
    ("top_k", 10**30, None),  # >= the vocabulary: disabled, as in vLLM
    ("seed", 2**64, "seed"),
    ("seed", -(2**63) - 1, "seed"),
    ("max_tokens", 10**30, "max_tokens"),
    ("stop_token_ids", [10**30], "stop_token_ids"),
    ("temperature", "1e300", "temperature"),
]


def test_d10_values_beside_an_in_flight_request(url, offline):
    want = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=300, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].text
    stream = start_stream(url)
    for field, value, needle in D10:
        r = post(url, {field: value, "temperature": 0.7} if field != "temperature" else {field: value})
        if needle is None:
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        else:
            assert_error(r, 400, needle)
        assert requests.get(url + "/health").status_code == 200, f"{field}={value!r} killed the engine"
    assert stream.is_alive(), "the valid stream must still be running while the bad requests come and go"
    stream.join(120)
    assert stream.text == want and stream.finish == "length"
    assert requests.get(url + "/health").status_code == 200
    wait_idle(url)


def test_negative_seeds_are_accepted_as_vllm_does(url, offline):
    kw = dict(temperature=0.9, max_tokens=8, ignore_eos=True)
    r = post(url, {"seed": -5, **kw})
    want = offline.generate(PROMPT, SamplingParams(seed=-5, **kw), use_tqdm=False)[0].outputs[0].text
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want


def test_a_failed_step_fails_its_request_and_the_server_keeps_serving(url, offline, monkeypatch):
    """Item 2: the engine loop survives a failed step; the client hears why, with no path of this machine."""
    wait_idle(url)
    runner = url.server.llm.engine.runner
    execute, calls = runner.execute, []

    def fails_once(output):
        calls.append(1)
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file", "/work/secret/kernel.so")
        return execute(output)

    monkeypatch.setattr(runner, "execute", fails_once)
    err = assert_error(post(url, {"temperature": 0}), 500, "the engine step failed", "FileNotFoundError", "<path>")
    assert "secret" not in err["message"]
    assert requests.get(url + "/health").status_code == 200
    want = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0].outputs[0].text
    assert post(url, {"temperature": 0}).json()["choices"][0]["text"] == want
    wait_idle(url)
    assert metric(url, "speclab:request_success_total", finished_reason="error") >= 1


# ----------------------------------------------------------------------------------------------
# D11: fields the server cannot honour


REFUSED = {  # a value that would change the answer, for every field of protocol.UNSUPPORTED
    "n": 2, "best_of": 2, "logprobs": 0, "top_logprobs": 2, "prompt_logprobs": 1, "echo": True, "suffix": "x",
    "logit_bias": {"5": 100}, "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2,
    "length_penalty": 0.5, "use_beam_search": True, "min_tokens": 3, "min_p": 0.1, "allowed_token_ids": [1, 2],
    "bad_words": ["x"], "include_stop_str_in_output": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "truncate_prompt_tokens": 8,
    "response_format": {"type": "json_object"}, "structured_outputs": {"json": {}}, "guided_json": {"type": "object"},
    "guided_regex": "a+", "guided_choice": ["a"], "guided_grammar": "root ::= 'a'",
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
    "functions": [{"name": "f"}], "function_call": "auto", "logits_processors": ["x"], "prediction": {"content": "x"},
    "audio": {"voice": "x"}, "modalities": ["audio"], "priority": 1, "continue_final_message": True,
    "chat_template": "{{ x }}", "chat_template_kwargs": {"a": 1},
}
NO_OPS = {"n": 1, "best_of": 1, "logprobs": None, "top_logprobs": 0, "min_tokens": 0, "min_p": 0.0,
          "repetition_penalty": 1.0, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
          "presence_penalty": 0, "skip_special_tokens": True, "priority": 0, "echo": False}


def test_the_refusal_table_is_tested_field_by_field():
    assert set(REFUSED) == set(UNSUPPORTED), "every field the server refuses has a value here"
    for d11 in ("logit_bias", "repetition_penalty", "min_tokens", "min_p", "best_of", "suffix", "response_format",
                "tools", "tool_choice", "top_logprobs", "logprobs"):
        assert d11 in UNSUPPORTED


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_a_field_the_server_cannot_honour_gets_a_400_naming_it(url, field):
    assert_error(post(url, {field: REFUSED[field]}), 400, field, param=field)


def test_no_op_values_of_those_fields_are_accepted(url):
    r = post(url, {**NO_OPS, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    chat = requests.post(url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "def f():"}]}],
        "max_tokens": 3, "logprobs": False, "temperature": 0})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 3


def test_unknown_fields_are_ignored_as_vllm_does(url):
    r = post(url, {"temperature": 0, "no_such_field": {"x": 1}, "user": "me"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_continuous_usage_stats_is_honoured(url):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: {")]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all(c.get("usage") for c in chunks) and counts == sorted(counts) and counts[-1] == 6


# ----------------------------------------------------------------------------------------------
# D12: bounded work for big bodies


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_multi_megabyte_prompts_are_refused_while_a_stream_keeps_flowing(url):
    """The server runs in this process: its memory is this process's RSS."""
    post(url, {"prompt": "x" * 900_000})  # warm up the JSON and body paths once
    # bodies encoded up front: this test's client shares the server's process (and GIL)
    raw = lambda obj: json.dumps(obj).encode()  # noqa: E731
    huge, chat, big = (raw({"model": MODEL, "prompt": "x = 1\n" * 2_000_000}),
                       raw({"model": MODEL, "messages": [{"role": "user", "content": "y" * 3_000_000}]}),
                       raw({"model": MODEL, "prompt": "def f():\n" * 100_000}))
    send = lambda path, data: requests.post(url + path, data=data, timeout=60,  # noqa: E731
                                            headers={"Content-Type": "application/json"})
    before = rss_mb()
    stream = start_stream(url, max_tokens=400)
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        assert_error(send("/v1/completions", huge), 413, "exceeds this server's limit", "1048576")
        assert_error(send("/v1/chat/completions", chat), 413)
        err = assert_error(send("/v1/completions", big), 400, "at least", "shorten the prompt")
        assert err["param"] == "prompt"
        times.append(time.monotonic() - t0)
    stream.join(120)
    assert stream.finish == "length" and stream.gaps, "the concurrent stream must finish"
    assert max(stream.gaps) < 1.0, f"the stream stalled {max(stream.gaps):.2f} s while big bodies were refused"
    assert max(times) < 10, f"refusing big bodies took {times} s"
    del huge, chat, big
    grown = rss_mb() - before
    assert grown < 100, f"the server kept {grown:.0f} MB after refusing big bodies"
    assert requests.get(url + "/health").status_code == 200


def test_chunked_oversize_bodies_are_refused_too(url):
    def chunks():
        for _ in range(40):
            yield b"x" * 65536
    r = requests.post(url + "/v1/completions", data=chunks(), headers={"Content-Type": "application/json"},
                      timeout=60)
    assert_error(r, 413, "more than 1048576 bytes")


# ----------------------------------------------------------------------------------------------
# D13: one error shape, messages that name the field and the fix


def test_every_error_has_the_one_shape_and_a_message_that_helps(url):
    assert_error(requests.get(url + "/v2/nothing"), 404, "no route GET /v2/nothing")
    assert_error(requests.get(url + "/v1/completions"), 405, "GET is not allowed")
    assert_error(requests.post(url + "/v1/completions", data=b'{"prompt": "\xff\xfe"}',
                               headers={"Content-Type": "application/json"}), 400)
    assert_error(requests.post(url + "/v1/completions", data=b'{"prompt": "x",,}',
                               headers={"Content-Type": "application/json"}), 400, "not valid JSON", param=None)
    assert_error(post(url, {"prompt": [1, 2, "three"]}), 400, "token ids must be integers", "index 2", param="prompt")
    assert_error(post(url, {"prompt": [1, 2.5]}), 400, "token ids must be integers", param="prompt")
    assert_error(post(url, {"prompt": {"a": 1}}), 400, "prompt must be a string", param="prompt")
    assert_error(post(url, {"prompt": ["a", "b"]}), 400, "2 prompts in one request", param="prompt")
    assert_error(requests.post(url + "/v1/completions", data=b'{"prompt": "a\\ud800b", "max_tokens": 2}',
                               headers={"Content-Type": "application/json"}), 400, "lone UTF-16 surrogate",
                 param="prompt")
    assert_error(post(url, {"stop": ["\ud800"]}), 400, "surrogate", param="stop")
    assert_error(post(url, {"stop": [f"s{i}" for i in range(65)]}), 400, "at most 64", param="stop")
    assert_error(requests.post(url + "/v1/completions", json={"max_tokens": 2}), 400, "prompt is required",
                 param="prompt")
    assert_error(post(url, {"model": "gpt-9"}), 404, "gpt-9", param="model")
    assert_error(post(url, {"max_tokens": 10_000}), 400, "context", param="max_tokens")


def test_a_chat_request_to_a_model_without_a_template_names_the_flag_not_a_path():
    with running_server(["--max-num-seqs", "2"]) as u:
        r = requests.post(u + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                          timeout=60)
        assert_error(r, 400, "no chat template", "--chat-template", param="messages")


# ----------------------------------------------------------------------------------------------
# D14: what the client was told is what the metrics count


def tokens_through(tokenizer, ids, stop):
    """How many of `ids` it takes for the decoded text to contain `stop`."""
    return next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n], skip_special_tokens=True))


def test_a_stop_string_completed_by_the_last_allowed_token_is_stop_for_client_and_metrics(url, offline):
    out = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    before_text = offline.tokenizer.decode(out.token_ids[:11], skip_special_tokens=True)
    stop = out.text[len(before_text) - 2:]  # ends inside the 12th token's text: only the last token completes it
    assert stop not in before_text and tokens_through(offline.tokenizer, out.token_ids, stop) == 12
    wait_idle(url)
    counts = {r: metric(url, "speclab:request_success_total", finished_reason=r) for r in ("stop", "length")}
    gen = metric(url, "speclab:generation_tokens_total")
    r = post(url, {"max_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": [stop]}).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["choices"][0]["text"] == out.text[:out.text.index(stop)]
    wait_idle(url)
    assert metric(url, "speclab:request_success_total", finished_reason="stop") == counts["stop"] + 1
    assert metric(url, "speclab:request_success_total", finished_reason="length") == counts["length"]
    assert metric(url, "speclab:generation_tokens_total") - gen == r["usage"]["completion_tokens"] == 12


def test_no_tokens_are_counted_past_a_stop_string(url, offline):
    """With n-gram drafts a step brings several tokens; those after the stop string are neither sent nor counted."""
    out = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    stop = out.text[len(out.text) // 2:len(out.text) // 2 + 3]
    n = tokens_through(offline.tokenizer, out.token_ids, stop)
    wait_idle(url)
    gen = metric(url, "speclab:generation_tokens_total")
    for stream in (False, True):
        body = {"max_tokens": 40, "temperature": 0, "ignore_eos": True, "stop": stop, "stream": stream,
                "stream_options": {"include_usage": True} if stream else None}
        r = post(url, body)
        if stream:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: {")]
            used, text = chunks[-1]["usage"]["completion_tokens"], "".join(c["choices"][0]["text"] for c in chunks[:-1])
        else:
            used, text = r.json()["usage"]["completion_tokens"], r.json()["choices"][0]["text"]
        assert used == n and text == out.text[:out.text.index(stop)]
        wait_idle(url)
    assert metric(url, "speclab:generation_tokens_total") - gen == 2 * n


# ----------------------------------------------------------------------------------------------
# D15: --max-model-len and a pool smaller than one context


def test_a_small_pool_caps_the_context_and_chat_without_max_tokens_works():
    # 12 blocks of 16 tokens hold 192 tokens: under the embedded model's 512-token context
    with running_server(["--num-gpu-blocks-override", "12", "--max-num-seqs", "4", "--chat-template", TEMPLATE]) as u:
        card = requests.get(u + "/v1/models").json()["data"][0]
        assert card["max_model_len"] == 12 * 16
        r = requests.post(u + "/v1/chat/completions", timeout=120,
                          json={"messages": [{"role": "user", "content": "def f():"}], "temperature": 0})
        assert r.status_code == 200, r.text
        # four long requests on a pool for one: preemptions, counted as vLLM counts them
        bodies = [{"model": MODEL, "prompt": f"def f{i}(x):", "max_tokens": 150, "temperature": 0, "ignore_eos": True}
                  for i in range(4)]
        threads = [threading.Thread(target=requests.post, args=(u + "/v1/completions",), kwargs={"json": b})
                   for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        wait_idle(u)
        preempted = u.server.llm.engine.scheduler.num_preemptions
        assert preempted > 0 and metric(u, "speclab:num_preemptions_total") == preempted


@pytest.mark.parametrize("flags, needle", [
    (["--num-gpu-blocks-override", "4", "--max-model-len", "512"], "does not fit the KV pool"),
    (["--max-model-len", "1K"], "exceeds the model's context"),
    (["--max-model-len", "lots"], "--max-model-len takes a token count"),
    (["--max-request-body-bytes", "0"], "--max-request-body-bytes must be >= 1"),
])
def test_a_context_the_pool_or_model_cannot_hold_is_refused_at_startup(flags, needle, capsys):
    from speclab.serve.cli import main
    with pytest.raises(SystemExit) as e:
        main(["serve", *flags])
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_max_model_len_accepts_vllms_suffixes():
    from speclab.serve.cli import model_len_arg
    assert [model_len_arg(x) for x in ("256", "1k", "1K", "0.5k")] == [256, 1000, 1024, 500]
    with running_server(["--max-model-len", "0.25k"]) as u:
        assert requests.get(u + "/v1/models").json()["data"][0]["max_model_len"] == 250
        assert_error(post(u, {"max_tokens": 249, "prompt": "def f():\n  return 1"}), 400, "250 tokens")


# ----------------------------------------------------------------------------------------------
# D16: safe defaults


def test_serve_binds_loopback_unless_told_otherwise():
    import argparse

    from speclab.serve.cli import add_serve_args, banner
    p = argparse.ArgumentParser()
    add_serve_args(p)
    args = p.parse_args([])
    assert args.host == "127.0.0.1"

    class S:
        name, api_key, max_model_len = MODEL, None, 512
    assert "--host 0.0.0.0" in banner(S, args)
    assert "WITHOUT an API key" in banner(S, p.parse_args(["--host", "0.0.0.0"]))


def test_the_api_key_from_the_environment_guards_every_route_but_the_public_ones(monkeypatch):
    monkeypatch.setenv("SPECLAB_API_KEY", "s3cret")
    with running_server() as u:
        for path in ("/v1/models", "/debug/state"):
            assert_error(requests.get(u + path), 401, "Authorization: Bearer")
            assert_error(requests.get(u + path, headers={"Authorization": "Bearer wrong"}), 401)
            assert_error(requests.get(u + path, headers={"Authorization": "Basic s3cret"}), 401)
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert requests.get(u + "/debug/state", headers={"Authorization": f"{scheme} s3cret"}).status_code == 200
        for path in ("/health", "/version", "/metrics", "/openapi.json"):
            assert requests.get(u + path).status_code == 200, path
        good = openai.OpenAI(base_url=u + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=u + "/v1", api_key="nope", max_retries=0).models.list()
    monkeypatch.delenv("SPECLAB_API_KEY")
    with running_server(["--api-key", "flag"]) as u:  # the flag, when given, wins
        assert requests.get(u + "/v1/models", headers={"Authorization": "Bearer flag"}).status_code == 200


def test_docs_and_readme_never_teach_an_exposed_server():
    root = os.path.join(os.path.dirname(__file__), "..")
    readme = open(os.path.join(root, "README.md")).read()
    nb = json.load(open(os.path.join(root, "notebooks", "09_serving.ipynb")))
    cells = ["".join(c["source"]) for c in nb["cells"]]
    for text in [readme, *cells]:
        for line in text.splitlines():
            if "speclab serve" in line and "--port" in line:
                assert "--host 127.0.0.1" in line, f"a served command without --host 127.0.0.1: {line!r}"


# ----------------------------------------------------------------------------------------------
# the watchdog, and the import circle


@pytest.mark.slow
def test_a_dead_engine_loop_exits_the_process_with_the_cause():
    """vLLM's watchdog: a server whose engine loop died must exit non-zero, not answer 503 forever."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import speclab.serve.async_engine as a\n"
            "def boom(self): raise RuntimeError('injected loop failure')\n"
            "a.AsyncEngine._emit = boom\n"
            f"from speclab.serve.cli import main; main(['serve', '--port', '{port}', '--max-num-seqs', '2'])\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.3)
        r = requests.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "x", "max_tokens": 2},
                          timeout=30)
        assert r.status_code == 500 and r.json()["error"]["code"] == 500
        t0 = time.monotonic()
        rc = proc.wait(timeout=30)
        assert rc == 1 and time.monotonic() - t0 < 15
        err = proc.stderr.read()
        assert "injected loop failure" in err and "exiting with status 1" in err
    finally:
        proc.kill()

