"""The SmolLM2 draft's distillation loop stops and resumes, draws the data it is asked to, and goes on
from the shipped draft. A tiny Llama stands in for the draft, so this runs everywhere in seconds."""

import json
import random

import pytest
import torch

from speclab.train import smollm2_draft as D


def _tiny_draft(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    draft = LlamaForCausalLM(cfg)
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft


def _rows(n: int, seed: int, k: int = 4) -> list:
    """(ids, prompt_len, (top-k indices, log-probabilities)) rows as the teacher data gives them."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        T = int(torch.randint(8, 20, (1,), generator=g))
        ids = torch.randint(0, 64, (T,), generator=g).tolist()
        logits = torch.randn(T - 1, 64, generator=g)
        val, idx = torch.log_softmax(logits, -1).topk(k, -1)
        rows.append((ids, int(torch.randint(1, 5, (1,), generator=g)), (idx.to(torch.int32), val.half())))
    return rows


def _run(draft, ckpt, **kw):
    return D.train(draft, _rows(12, 1), _rows(3, 2), steps=6, budget_minutes=1e6, tokens_per_step=32, lr=1e-2,
                   seed=0, log=lambda m: None, eval_every=2, ckpt=ckpt, **kw)


def test_a_stopped_run_resumes_to_the_same_weights_as_one_that_never_stopped(tmp_path):
    whole = _tiny_draft()
    fig = _run(whole, tmp_path / "a.pt")
    calls = []
    stopped = _tiny_draft()
    assert _run(stopped, tmp_path / "b.pt", should_stop=lambda: calls.append(1) or len(calls) > 3) is None
    assert torch.load(tmp_path / "b.pt", weights_only=False)["loop"].step == 3
    resumed = _tiny_draft()           # the same frozen embeddings (the target's), other layers: the
    with torch.no_grad():             # checkpoint must carry the draft's own weights
        for name, p in resumed.named_parameters():
            if p.requires_grad:
                p.normal_()
    fig2 = _run(resumed, tmp_path / "b.pt", resume=True)
    assert fig2["steps"] == fig["steps"] == 6 and fig2["resumed"] == 1
    assert fig2["val_history"] == fig["val_history"] and fig2["kept_step"] == fig["kept_step"]
    for (k, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        if not k.startswith(("model.embed_tokens", "lm_head")):
            assert torch.equal(a, b), k          # the kept (best validation) weights
    last = [torch.load(tmp_path / f, weights_only=False)["draft"] for f in ("a.pt", "b.pt")]
    assert all(torch.equal(last[0][k], last[1][k]) for k in last[0])     # and the last step's


def test_resuming_without_its_random_state_would_differ(tmp_path):
    """Negative control: a run that resumed the weights and the optimiser but drew its rows afresh
    ends elsewhere, so the test above can see a resume that forgets the data order."""
    _run(_tiny_draft(), tmp_path / "a.pt")
    calls = []
    _run(_tiny_draft(), tmp_path / "b.pt", should_stop=lambda: calls.append(1) or len(calls) > 3)
    st = torch.load(tmp_path / "b.pt", weights_only=False)
    st["rng"] = random.Random(99).getstate()
    torch.save(st, tmp_path / "b.pt")
    _run(_tiny_draft(), tmp_path / "b.pt", resume=True)
    last = [torch.load(tmp_path / f, weights_only=False)["draft"] for f in ("a.pt", "b.pt")]
    assert any(not torch.equal(last[0][k], last[1][k]) for k in last[0])


def test_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path):
    a, b = _tiny_draft(), _tiny_draft()
    _run(a, tmp_path / "a.pt")
    _run(b, tmp_path / "none" / "b.pt", resume=True)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _data(n_answers: int, n_windows: int) -> D._Data:
    return D._Data({}, {}, _rows(n_answers + n_windows, 3), [], n_windows, 0.0, 0.0)


def test_teacher_share_draws_the_answers_that_often():
    d = _data(30, 70)
    w = D.row_weights(d, 0.6)
    rng, loop = random.Random(0), D._Loop(order=[])
    draws = [D._draw(d.train, loop, rng, w) for _ in range(4000)]
    share = sum(i < 30 for i in draws) / len(draws)
    assert abs(share - 0.6) < 0.03, share          # 4000 draws: sd 0.008
    assert D.row_weights(d, None) is None and D.row_weights(_data(5, 0), 0.5) is None
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        D.row_weights(d, 1.0)


def test_without_a_share_each_pass_draws_every_row_once():
    rows = _rows(9, 4)
    rng, loop = random.Random(0), D._Loop(order=[])
    assert sorted(D._draw(rows, loop, rng, None) for _ in range(9)) == list(range(9))


def test_the_shipped_layers_go_into_a_draft_of_their_shape_only(tmp_path):
    from safetensors.torch import save_file
    draft = _tiny_draft()
    own = {k: v.half() for k, v in D._own(draft.state_dict()).items()}
    save_file(own, str(tmp_path / "layers.safetensors"))
    other = _tiny_draft(seed=3)
    D.load_shipped_layers(other, tmp_path)
    assert all(torch.equal(v.half(), own[k]) for k, v in D._own(other.state_dict()).items())
    del own["model.norm.weight"]
    save_file(own, str(tmp_path / "layers.safetensors"))
    with pytest.raises(ValueError, match="does not fit a 4-layer draft: missing \\['model.norm.weight'\\]"):
        D.load_shipped_layers(_tiny_draft(), tmp_path)


def test_a_new_draft_keeps_the_shipped_token_ranking(tmp_path):
    from speclab.models.draft_vocab import RANKING_FILE
    from speclab.models.smollm2_draft import SHIPPED, shipped_manifest
    if not (SHIPPED / RANKING_FILE).is_file():
        pytest.skip("this checkout ships no token ranking")
    manifest = {"model": "x"}
    D._keep_ranking(tmp_path, manifest)
    assert manifest["token_ranking"] == shipped_manifest()["token_ranking"]
    assert json.loads((tmp_path / RANKING_FILE).read_text()) == json.loads((SHIPPED / RANKING_FILE).read_text())
