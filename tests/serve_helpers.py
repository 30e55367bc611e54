"""Shared pieces of the lesson 09 server tests: a chat template for the embedded model, polling."""

import time

import requests

# The embedded target has no chat template (it is a code model); this one lets the chat endpoint
# be tested on it. The real model brings its own (ChatML).
TEMPLATE = ("{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}# assistant:{% endif %}")
NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'


def wait_idle(url: str, timeout: float = 30.0) -> dict:
    """Poll /debug/state until no request is held and every KV block is free; return the state."""
    deadline = time.monotonic() + timeout
    while True:
        state = requests.get(url + "/debug/state", timeout=10).json()
        if state["num_tracked"] == 0 and state["num_free_kv_blocks"] == state["num_kv_blocks"]:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not go idle within {timeout}s: {state}")
        time.sleep(0.05)


def metric(url: str, name: str, **labels) -> float:
    """The value of one series on /metrics (sum over the series that match `labels`)."""
    from prometheus_client.parser import text_string_to_metric_families

    total, found = 0.0, False
    for fam in text_string_to_metric_families(requests.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total, found = total + s.value, True
    if not found:
        raise KeyError(f"no series {name}{labels} on /metrics")
    return total
