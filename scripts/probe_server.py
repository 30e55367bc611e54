"""A hostile-but-fair probe of the engine and `speclab serve` (issue 19's cases D10-D18), re-runnable.

    .venv/bin/python scripts/probe_server.py                 # starts its own servers on 127.0.0.1
    .venv/bin/python scripts/probe_server.py --json probe.json

Every case is tried as a user or an attacker would, and classified:
    ok              the documented behaviour (a value honoured, output equal to the offline engine's)
    clear error     refused with a 4xx in the one error shape (offline: ValueError/TypeError) whose
                    message names the field or the fix
    unclear error   refused, but the message does not say what was wrong (or the shape is not vLLM's)
    crash           a 5xx for a bad request, /health no longer 200, an exception from deep inside
                    torch, or valid requests that lost their output
    silently wrong  a 200 that ignored what was asked, a wrong output, a leak
    hang            no answer within the time limit, or a stream that stalled over 1 s
The table at the end is the one issue 19's closing note asks for. Traffic goes to 127.0.0.1 only;
the case list is fixed and every request has a timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from serve_helpers import NGRAM, TEMPLATE, metric, wait_idle  # noqa: E402

from speclab import LLM, SamplingParams  # noqa: E402
from speclab.serve.launch import running_server  # noqa: E402

MODEL, PROMPT, TIMEOUT = "speclab-target", "def fibonacci(n):\n", 60
CLASSES = ("ok", "clear error", "unclear error", "crash", "silently wrong", "hang")


@dataclass
class Case:
    group: str
    name: str
    outcome: str
    detail: str = ""


class Probe:
    def __init__(self, url: str, offline: LLM):
        self.url, self.offline, self.cases = url, offline, []

    def record(self, group, name, outcome, detail=""):
        self.cases.append(Case(group, name, outcome, detail))
        print(f"  {group:4} {outcome:15} {name}  {detail[:110]}", flush=True)

    # ------------------------------------------------------------------------------------------
    # HTTP

    def post(self, body, path="/v1/completions", **kw):
        return requests.post(self.url + path, json=body, timeout=TIMEOUT, **kw)

    def healthy(self) -> bool:
        try:
            return requests.get(self.url + "/health", timeout=10).status_code == 200
        except requests.RequestException:
            return False

    def expect_error(self, group, name, send, needle, status=400):
        """A bad request: it must get `status` in the error shape, its message naming `needle`."""
        try:
            r = send()
        except requests.Timeout:
            return self.record(group, name, "hang", f"no answer in {TIMEOUT}s")
        except requests.RequestException as e:
            return self.record(group, name, "crash", f"connection failed: {type(e).__name__}")
        if not self.healthy():
            return self.record(group, name, "crash", "/health is no longer 200")
        if r.status_code >= 500:
            return self.record(group, name, "crash", f"{r.status_code} {r.text[:80]}")
        if r.status_code < 400:
            return self.record(group, name, "silently wrong", f"{r.status_code}: accepted")
        try:
            err = r.json()["error"]
            shaped = isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}
        except (ValueError, KeyError, TypeError):
            shaped, err = False, {"message": r.text[:80]}
        clear = shaped and r.status_code == status and needle.lower() in err["message"].lower() \
            and "/work" not in err["message"] and "site-packages" not in err["message"]
        self.record(group, name, "clear error" if clear else "unclear error", f"{r.status_code} {err.get('message', '')}")

    def expect_ok(self, group, name, send, check):
        """A request that must succeed; `check(response)` returns '' when right, else what was wrong."""
        try:
            r = send()
        except requests.Timeout:
            return self.record(group, name, "hang", f"no answer in {TIMEOUT}s")
        except requests.RequestException as e:
            return self.record(group, name, "crash", f"connection failed: {type(e).__name__}")
        if r.status_code >= 500 or not self.healthy():
            return self.record(group, name, "crash", f"{r.status_code} {r.text[:80]}")
        if r.status_code != 200:
            return self.record(group, name, "unclear error", f"{r.status_code} {r.text[:100]}")
        wrong = check(r)
        self.record(group, name, "silently wrong" if wrong else "ok", wrong or "")

    # ------------------------------------------------------------------------------------------
    # offline

    def offline_case(self, group, name, fn, needle=None):
        """fn() must raise ValueError/TypeError naming `needle` (needle given), or return '' (needle None)."""
        try:
            wrong = fn()
        except (ValueError, TypeError) as e:
            if needle is None:
                return self.record(group, name, "unclear error", f"{type(e).__name__}: {e}")
            clear = needle in str(e) and "unpacking" not in str(e)
            return self.record(group, name, "clear error" if clear else "unclear error", f"{type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - what the probe is looking for
            return self.record(group, name, "crash", f"{type(e).__name__}: {e}")
        if needle is not None:
            return self.record(group, name, "silently wrong", f"accepted: {wrong!r}")
        self.record(group, name, "silently wrong" if wrong else "ok", wrong or "")


# ----------------------------------------------------------------------------------------------
# the cases


class Stream(threading.Thread):
    """A long valid greedy stream in the background (text, finish, gaps between chunks)."""

    def __init__(self, url, max_tokens=300):
        super().__init__(daemon=True)
        self.url, self.max_tokens, self.text, self.finish, self.gaps = url, max_tokens, "", None, []
        self.started = threading.Event()

    def run(self):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True}
        last = None
        try:
            with requests.post(self.url + "/v1/completions", json=body, stream=True, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith(b"data: {"):
                        now = time.monotonic()
                        self.gaps += [now - last] if last else []
                        last = now
                        c = json.loads(line[6:])
                        if "choices" in c and c["choices"]:
                            self.text += c["choices"][0]["text"]
                            self.finish = c["choices"][0]["finish_reason"] or self.finish
                        self.started.set()
        finally:
            self.started.set()


def d10(p: Probe):
    V = p.offline.model.config.vocab_size
    want = p.offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=300, ignore_eos=True),
                              use_tqdm=False)[0].outputs[0].text
    stream = Stream(p.url)
    stream.start()
    stream.started.wait(60)
    bad = [("temperature", 1e300), ("temperature", 3.5e38), ("temperature", 1e39), ("top_p", 1e-50),
           ("top_p", 1e-39), ("top_p", 1e-45), ("seed", 2**64), ("seed", 2**63), ("seed", -(2**63) - 1),
           ("max_tokens", 10**30), ("stop_token_ids", [10**30]), ("stop_token_ids", [-1]), ("stop_token_ids", [V])]
    for field, value in bad:
        p.expect_error("D10", f"{field}={value!r} beside a stream", lambda: p.post(
            {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0.7, field: value}), field)
    for k in (10**30, 2**63, V, V + 1):  # vLLM: top_k >= vocabulary disables it
        ref = p.offline.generate(PROMPT, SamplingParams(temperature=0.8, seed=1, max_tokens=6), use_tqdm=False)
        p.expect_ok("D10", f"top_k={k} (disabled) beside a stream", lambda: p.post(
            {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.8, "seed": 1, "top_k": k}),
            lambda r: "" if r.json()["choices"][0]["text"] == ref[0].outputs[0].text else "not the top_k=0 output")
    for field, value in [("temperature", 1e300), ("top_p", 1e-50)]:
        p.expect_error("D10", f"chat {field}={value!r}", lambda: p.post(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, field: value},
            "/v1/chat/completions"), field)
        p.expect_error("D10", f"streamed {field}={value!r}", lambda: p.post(
            {"prompt": PROMPT, "max_tokens": 4, "stream": True, field: value}), field)
    stream.join(120)
    ok = stream.text == want and stream.finish == "length"
    p.record("D10", "the in-flight valid stream", "ok" if ok else "crash",
             "" if ok else f"finish={stream.finish} text equal={stream.text == want}")
    p.record("D10", "/health after D10", "ok" if p.healthy() else "crash")
    d10_offline(p)


def d10_offline(p: Probe):
    from speclab.engine.request import RequestFailedError
    llm = p.offline
    for kw, needle in [(dict(temperature=1e300), "temperature"), (dict(top_p=1e-50), "top_p"),
                       (dict(seed=2**64), "seed")]:
        p.offline_case("D10", f"offline SamplingParams({kw})", lambda: SamplingParams(**kw), needle)

    def top_k_huge():
        a = llm.generate(PROMPT, SamplingParams(temperature=0.8, seed=2, max_tokens=6, top_k=10**30), use_tqdm=False)
        b = llm.generate(PROMPT, SamplingParams(temperature=0.8, seed=2, max_tokens=6), use_tqdm=False)
        return "" if a[0].outputs[0].token_ids == b[0].outputs[0].token_ids else "top_k=10**30 != disabled"
    p.offline_case("D10", "offline top_k=10**30 (disabled)", top_k_huge)

    def mixed_batch():  # a request whose params go bad behind validation's back: only it may fail
        class Bad(SamplingParams):
            def engine_problem(self):
                return "injected"
        greedy = SamplingParams(temperature=0, max_tokens=6)
        want = llm.generate([PROMPT, "import os"], greedy, use_tqdm=False)
        try:
            llm.generate([PROMPT, "x = 1", "import os"], [greedy, Bad(temperature=0, max_tokens=6), greedy],
                         use_tqdm=False)
        except RequestFailedError as e:
            got = [e.outputs[0].outputs[0].token_ids, e.outputs[2].outputs[0].token_ids]
            return "" if got == [o.outputs[0].token_ids for o in want] else "the valid outputs changed"
        return "the failed request was not reported"
    p.offline_case("D10", "offline mixed batch keeps the valid outputs", mixed_batch)


REFUSED = {"logit_bias": {"5": 100}, "repetition_penalty": 1.2, "min_tokens": 3, "min_p": 0.1, "best_of": 2,
           "suffix": "x", "response_format": {"type": "json_object"}, "tools": [{"type": "function",
                                                                                 "function": {"name": "f"}}],
           "tool_choice": "auto", "top_logprobs": 2, "logprobs": 0, "n": 2, "echo": True, "presence_penalty": 0.5,
           "frequency_penalty": 0.5, "use_beam_search": True, "allowed_token_ids": [1], "prompt_logprobs": 1,
           "guided_json": {}, "include_stop_str_in_output": True, "skip_special_tokens": False,
           "truncate_prompt_tokens": 4, "priority": 3}


def d11(p: Probe):
    for field, value in REFUSED.items():
        p.expect_error("D11", f"{field}={value!r}", lambda: p.post({"prompt": PROMPT, "max_tokens": 4, field: value}),
                       field)
    p.expect_error("D11", "chat logprobs=true", lambda: p.post(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True}, "/v1/chat/completions"),
        "logprobs")
    noop = {"n": 1, "min_tokens": 0, "min_p": 0, "repetition_penalty": 1, "logprobs": None,
            "response_format": {"type": "text"}, "tool_choice": "none"}
    p.expect_ok("D11", "no-op values accepted", lambda: p.post({"prompt": PROMPT, "max_tokens": 3, **noop}),
                lambda r: "" if r.json()["usage"]["completion_tokens"] == 3 else "wrong length")
    p.expect_ok("D11", "unknown field ignored (as vLLM)", lambda: p.post({"prompt": PROMPT, "max_tokens": 3, "zzz": 1}),
                lambda r: "")


def rss_mb(server_pid=None) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def d12(p: Probe):
    # The bodies are encoded before the stream starts: the probe's client shares this process (and its
    # GIL) with the server, and json.dumps of 3.5M token ids would otherwise stall the reader, not the server.
    raw = lambda obj: json.dumps(obj).encode()  # noqa: E731
    big = {"prompt": raw({"prompt": "x = 1\n" * 1_700_000}), "ids": raw({"prompt": [5] * 3_500_000}),
           "chat": raw({"messages": [{"role": "user", "content": "y" * 3_000_000}]}),
           "900k": raw({"prompt": "def f():\n" * 100_000})}
    send = lambda path, key: lambda: requests.post(p.url + path, data=big[key], timeout=TIMEOUT,  # noqa: E731
                                                   headers={"Content-Type": "application/json"})
    before = rss_mb()
    stream = Stream(p.url, 400)
    stream.start()
    stream.started.wait(60)
    t0 = time.monotonic()
    p.expect_error("D12", "10 MB prompt", send("/v1/completions", "prompt"), "limit", 413)
    p.expect_error("D12", "10 MB token-id list", send("/v1/completions", "ids"), "limit", 413)
    p.expect_error("D12", "3 MB chat message", send("/v1/chat/completions", "chat"), "limit", 413)
    p.expect_error("D12", "900 KB prompt (under the body limit)", send("/v1/completions", "900k"), "shorten the prompt")
    p.expect_error("D12", "chunked 2.6 MB body", lambda: requests.post(
        p.url + "/v1/completions", data=(b"x" * 65536 for _ in range(40)), timeout=TIMEOUT,
        headers={"Content-Type": "application/json"}), "limit", 413)
    took = time.monotonic() - t0
    p.record("D12", "big bodies refused in bounded time", "ok" if took < 10 else "hang", f"{took:.2f} s")
    stream.join(120)
    gap = max(stream.gaps or [float("inf")])
    p.record("D12", "concurrent stream kept flowing", "ok" if gap < 1.0 else "hang", f"largest gap {gap:.3f} s")
    del big
    grown = rss_mb() - before
    p.record("D12", "memory returned within 100 MB", "ok" if grown < 100 else "silently wrong", f"{grown:+.0f} MB")


def d13(p: Probe):
    raw = lambda data: lambda: requests.post(p.url + "/v1/completions", data=data, timeout=TIMEOUT,  # noqa: E731
                                             headers={"Content-Type": "application/json"})
    p.expect_error("D13", "non-UTF-8 body", raw(b'{"prompt": "\xff\xfe"}'), "UTF-8")
    p.expect_error("D13", "JSON syntax error (no offset as param)", raw(b'{"prompt": "x",,}'), "not valid JSON")
    p.expect_error("D13", "unknown path", lambda: requests.get(p.url + "/v2/x", timeout=TIMEOUT), "no route", 404)
    p.expect_error("D13", "wrong method", lambda: requests.get(p.url + "/v1/completions", timeout=TIMEOUT),
                   "not allowed", 405)
    p.expect_error("D13", "non-integer token id", lambda: p.post({"prompt": [1, "two"]}), "token ids must be integers")
    p.expect_error("D13", "float token id", lambda: p.post({"prompt": [1, 2.5]}), "token ids must be integers")
    p.expect_error("D13", "lone surrogate prompt", raw(b'{"prompt": "a\\ud800"}'), "surrogate")
    p.expect_error("D13", "lone surrogate chat content", lambda: requests.post(
        p.url + "/v1/chat/completions", data=b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
        headers={"Content-Type": "application/json"}, timeout=TIMEOUT), "surrogate")
    p.expect_error("D13", "empty messages", lambda: p.post({"messages": []}, "/v1/chat/completions"), "messages")
    p.expect_error("D13", "unknown role", lambda: p.post({"messages": [{"role": "wizard", "content": "x"}]},
                                                         "/v1/chat/completions"), "role")
    p.expect_error("D13", "missing prompt", lambda: p.post({"max_tokens": 2}), "prompt is required")
    p.expect_error("D13", "two prompts", lambda: p.post({"prompt": ["a", "b"]}), "2 prompts")
    p.expect_error("D13", "unknown model", lambda: p.post({"model": "gpt-9", "prompt": "x"}), "gpt-9", 404)
    p.expect_error("D13", "prompt + max_tokens over the context", lambda: p.post({"prompt": "x", "max_tokens": 600}),
                   "context")


def d14(p: Probe):
    tok = p.offline.tokenizer
    out = p.offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0]
    head = tok.decode(out.token_ids[:11], skip_special_tokens=True)
    stop = out.text[len(head) - 2:]
    wait_idle(p.url)
    s0, l0 = (metric(p.url, "speclab:request_success_total", finished_reason=r) for r in ("stop", "length"))
    g0 = metric(p.url, "speclab:generation_tokens_total")
    r = p.post({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": [stop]}).json()
    wait_idle(p.url)
    s1, l1 = (metric(p.url, "speclab:request_success_total", finished_reason=r) for r in ("stop", "length"))
    same = r["choices"][0]["finish_reason"] == "stop" and (s1 - s0, l1 - l0) == (1, 0)
    p.record("D14", "stop string completed by the last allowed token", "ok" if same else "silently wrong",
             f"client {r['choices'][0]['finish_reason']}, metrics stop +{s1 - s0} length +{l1 - l0}")
    out = p.offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0]
    stop = out.text[len(out.text) // 2:len(out.text) // 2 + 3]
    g0 = metric(p.url, "speclab:generation_tokens_total")
    r = p.post({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stop": stop}).json()
    wait_idle(p.url)
    counted = metric(p.url, "speclab:generation_tokens_total") - g0
    ok = counted == r["usage"]["completion_tokens"]
    p.record("D14", "no tokens counted past a stop string", "ok" if ok else "silently wrong",
             f"metrics {counted:.0f}, usage {r['usage']['completion_tokens']}")
    try:
        metric(p.url, "speclab:num_preemptions_total")
        p.record("D14", "preemption counter exposed", "ok")
    except KeyError:
        p.record("D14", "preemption counter exposed", "silently wrong", "missing")


def d15(p: Probe):
    with running_server(["--num-gpu-blocks-override", "12", "--chat-template", TEMPLATE]) as u:
        r = requests.post(u + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "def f():"}],
                                                             "temperature": 0}, timeout=120)
        p.record("D15", "small pool: chat without max_tokens", "ok" if r.status_code == 200 else "unclear error",
                 f"{r.status_code}, max_model_len {requests.get(u + '/v1/models').json()['data'][0]['max_model_len']}")

    def too_big():
        from speclab.serve.cli import main
        try:
            main(["serve", "--num-gpu-blocks-override", "4", "--max-model-len", "512"])
        except SystemExit as e:
            raise ValueError("exit 2: does not fit the KV pool") if e.code == 2 else e
        return "started"
    p.offline_case("D15", "--max-model-len over the pool refused at startup", too_big, "does not fit the KV pool")


def d16(p: Probe):
    import argparse

    from speclab.serve.cli import add_serve_args
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    host = parser.parse_args([]).host
    p.record("D16", "default bind address", "ok" if host == "127.0.0.1" else "silently wrong", host)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    lines = [x for x in readme.splitlines() if "speclab serve" in x and "--port" in x]
    p.record("D16", "README's serve command passes --host 127.0.0.1",
             "ok" if lines and all("--host 127.0.0.1" in x for x in lines) else "silently wrong")
    import os
    os.environ["SPECLAB_API_KEY"] = "k3y"
    try:
        with running_server() as u:
            q = Probe(u, p.offline)
            q.cases = p.cases
            q.expect_error("D16", "/debug/state without the key", lambda: requests.get(u + "/debug/state", timeout=10),
                           "Authorization", 401)
            q.expect_error("D16", "/v1/models with a wrong key", lambda: requests.get(
                u + "/v1/models", headers={"Authorization": "Bearer nope"}, timeout=10), "Unauthorized", 401)
            q.expect_ok("D16", "lower-case bearer scheme", lambda: requests.get(
                u + "/v1/models", headers={"Authorization": "bearer k3y"}, timeout=10), lambda r: "")
            q.expect_ok("D16", "key from SPECLAB_API_KEY", lambda: requests.post(
                u + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"Authorization": "Bearer k3y"},
                timeout=60), lambda r: "")
            q.expect_ok("D16", "/health stays public", lambda: requests.get(u + "/health", timeout=10), lambda r: "")
            q.expect_error("D16", "chat error leaks no path", lambda: requests.post(
                u + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": "Bearer k3y"}, timeout=60), "--chat-template")
    finally:
        del os.environ["SPECLAB_API_KEY"]


def d17_d18(p: Probe):
    llm = p.offline
    kw = dict(temperature=1.0, max_tokens=8, ignore_eos=True)

    def negative_seed():
        a = llm.generate(PROMPT, SamplingParams(seed=-3, **kw), use_tqdm=False)[0].outputs[0].token_ids
        b = llm.generate(PROMPT, SamplingParams(seed=-3, **kw), use_tqdm=False)[0].outputs[0].token_ids
        return "" if a == b else "not reproducible"
    p.offline_case("D17", "negative seed accepted, reproducible", negative_seed)
    p.expect_ok("D17", "negative seed over HTTP", lambda: p.post({"prompt": PROMPT, "seed": -3, **kw}), lambda r: "")
    p.offline_case("D17", "SamplingParams(seed=2**64)", lambda: SamplingParams(seed=2**64), "int64")
    p.offline_case("D17", "LLM(seed=2**64)", lambda: LLM(seed=2**64), "seed must be an integer")
    ids = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0].token_ids

    def stop_iter(make):
        out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=make([ids[2]])),
                           use_tqdm=False)[0].outputs[0]
        return "" if out.token_ids == ids[:3] and out.finish_reason == "stop" else f"stop ignored: {out.token_ids}"
    p.offline_case("D18", "stop_token_ids=iter([t])", lambda: stop_iter(iter))
    p.offline_case("D18", "stop_token_ids=generator", lambda: stop_iter(lambda x: (t for t in x)))
    p.offline_case("D18", "LLM(model=123)", lambda: LLM(model=123), "model must be None")
    p.offline_case("D18", "top_k=2**63 offline", lambda: "" if llm.generate(
        PROMPT, SamplingParams(top_k=2**63, max_tokens=3), use_tqdm=False) else "no output")
    from speclab.spec_config import SpeculativeConfig
    p.offline_case("D18", "draft_model with model 'eagle'", lambda: SpeculativeConfig.from_dict(
        {"method": "draft_model", "model": "eagle", "num_speculative_tokens": 2}), "use method 'eagle'")


def engine_loop(p: Probe):
    """A step that fails (an injected kernel error) must fail only its requests; the loop goes on."""
    runner = p.url.server.llm.engine.runner
    execute, calls = runner.execute, []

    def once(output):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected step failure")
        return execute(output)
    runner.execute = once
    try:
        r = p.post({"prompt": PROMPT, "max_tokens": 4})
        p.record("loop", "the failed step's request", "clear error" if r.status_code == 500 and "step failed" in
                 r.json()["error"]["message"] else "unclear error", f"{r.status_code} {r.text[:90]}")
    finally:
        runner.execute = execute
    p.expect_ok("loop", "the next request after a failed step", lambda: p.post({"prompt": PROMPT, "max_tokens": 4}),
                lambda r: "" if r.json()["usage"]["completion_tokens"] == 4 else "wrong length")


def table(cases: list[Case]) -> str:
    groups = list(dict.fromkeys(c.group for c in cases))
    rows = [("group", "tried", *CLASSES)]
    for g in [*groups, "all"]:
        mine = [c for c in cases if g in ("all", c.group)]
        n = Counter(c.outcome for c in mine)
        rows.append((g, str(len(mine)), *[str(n[k]) for k in CLASSES]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    fmt = lambda r: "| " + " | ".join(x.ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(rows[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, rows[1:])])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="write every case and its outcome here")
    args = ap.parse_args(argv)
    offline = LLM(speculative_config=json.loads(NGRAM), max_num_seqs=8)
    offline.tokenizer.chat_template = TEMPLATE
    t0 = time.monotonic()
    with running_server(["--speculative-config", NGRAM, "--chat-template", TEMPLATE, "--max-num-seqs", "8"]) as url:
        p = Probe(url, offline)
        for part in (d10, d11, d12, d13, d14, d15, d16, d17_d18, engine_loop):
            part(p)
        wait_idle(url)
    print(f"\n{len(p.cases)} cases in {time.monotonic() - t0:.0f} s\n")
    print(table(p.cases))
    if args.json:
        Path(args.json).write_text(json.dumps([c.__dict__ for c in p.cases], indent=1))
    bad = [c for c in p.cases if c.outcome in ("crash", "silently wrong", "hang", "unclear error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
