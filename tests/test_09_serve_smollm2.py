"""`speclab serve smollm2`: the real model's own chat template through /v1/chat/completions, greedy
output equal to offline LLM.chat, with n-gram speculation. Skips without the model's wheel."""

import gc
import json

import pytest

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install -e '.[serve]'")
pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")

from speclab import LLM, SamplingParams  # noqa: E402
from speclab.data.chat_prompts import load_chat_prompts  # noqa: E402
from speclab.serve.launch import running_server  # noqa: E402
from tests.helpers import needs_smollm2_wheel  # noqa: E402

pytestmark = [pytest.mark.real_model, needs_smollm2_wheel()]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_chat_on_the_real_model_equals_offline_chat():
    conv = load_chat_prompts("edit")[0]
    # 128 blocks of 16 tokens (0.74 MB of KV each here, 94 MB in all): the default pool would take 1 GB per
    # engine, and this test's two engines, one after the other, need a conversation's worth
    offline = LLM(model="smollm2", speculative_config=NGRAM, max_num_seqs=4, num_kv_blocks=128)
    want = offline.chat(conv, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    del offline  # its weights and pool go before the server's come
    gc.collect()
    with running_server(["smollm2", "--speculative-config", json.dumps(NGRAM), "--max-num-seqs", "4",
                         "--num-gpu-blocks-override", "128"]) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="smollm2", messages=conv, max_tokens=24, temperature=0)
        assert r.choices[0].message.content == want.text
        assert r.usage.completion_tokens == len(want.token_ids)
        chunks = list(client.chat.completions.create(model="smollm2", messages=conv, max_tokens=24, temperature=0,
                                                     stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
