"""The decoder layers in one native call (speclab.models.cpu_decoder): the bits of the module path
(logits, caches and saved hidden states, float32 and bfloat16, a ragged batch with a tree); taken
where it applies and nowhere else; the kernels' errors; the switch; and a copy of the model that
reads its own weights. Negative control: a plan that runs one layer's weights twice must differ."""

import copy

import pytest
import torch

from speclab.engine.batch import TreeChunk, flatten
from speclab.kv_cache import KVCacheManager
from speclab.models import cpu_decoder, cpu_gemm
from speclab.models.llama import DecoderLayer, load_llama
from tests.helpers import needs_smollm2_wheel, tiny_llama

pytestmark = [pytest.mark.skipif(not cpu_decoder.available(), reason="speclab's CPU kernels are not built here: "
                                 + (cpu_decoder._why or "a kernel it calls is not available")),
              pytest.mark.usefixtures("one_torch_thread")]  # tests/conftest.py


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("decoder")
    tiny_llama(path, vocab_size=310, hidden_size=64, intermediate_size=96, num_attention_heads=4,
               num_key_value_heads=2, num_hidden_layers=3, head_scale=4.0, seed=5)
    return path


def step(model, caches, new_rows: int = 5, hidden_layers=()):
    """A prefill of three requests, then one mixed step over the same caches: request a decodes one
    token, b verifies `new_rows`, c verifies a 4-node tree (root, two children, a grandchild).
    Returns (logits of the step (N, V), hidden states saved, the caches)."""
    g = torch.Generator().manual_seed(0)
    ids = {r: torch.randint(0, model.config.vocab_size, (40,), generator=g).tolist() for r in "abc"}
    kv = KVCacheManager(24, 8)
    for r in "abc":
        kv.allocate(r, 0, 40)
    model(*flatten(kv, [("a", ids["a"][:20], 0), ("b", ids["b"][:17], 0), ("c", ids["c"][:9], 0)]), caches)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    tree = TreeChunk(positions=[9, 10, 10, 11], base=9, mask=mask)
    batch = flatten(kv, [("a", ids["a"][20:21], 20), ("b", ids["b"][17:17 + new_rows], 17),
                         ("c", ids["c"][9:13], 9, tree)])
    hidden, saved = model(*batch, caches, hidden_layers=hidden_layers)
    return model.compute_logits(hidden), saved, caches


def both_paths(model, **kw):
    """`step` with the one call and again with the layers module by module, on fresh caches each."""
    assert model.decoder_plan is not None, model.decoder_why
    ours = step(model, model.allocate_kv_cache(24, 8), **kw)
    plan, model.decoder_plan = model.decoder_plan, None
    try:
        theirs = step(model, model.allocate_kv_cache(24, 8), **kw)
    finally:
        model.decoder_plan = plan
    return ours, theirs


def same_bits(ours, theirs) -> bool:
    (logits, saved, caches), (logits2, saved2, caches2) = ours, theirs
    return (torch.equal(logits, logits2) and len(saved) == len(saved2) and all(map(torch.equal, saved, saved2))
            and all(torch.equal(a, b) for pair, pair2 in zip(caches, caches2) for a, b in zip(pair, pair2)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_call_gives_the_modules_bits(model_dir, dtype):
    model = load_llama(model_dir, dtype=dtype)
    ours, theirs = both_paths(model, hidden_layers=(0, 2, 3, 7))  # 7: past the last layer, ignored by both
    assert same_bits(ours, theirs)
    assert len(ours[1]) == 3 and not torch.equal(ours[1][1], ours[1][2])  # the embeddings, after layers 2 and 3


def test_the_check_catches_a_plan_with_a_wrong_layer(model_dir):
    """Negative control: a layer table holding the second layer's weights in place of the third's."""
    model = load_llama(model_dir)
    plan = model.decoder_plan
    short = cpu_decoder.DecoderPlan(plan.weights[:-1] + [plan.weights[-2]], plan.cfg)
    model.decoder_plan = short
    ours = step(model, model.allocate_kv_cache(24, 8))
    model.decoder_plan = None
    assert not same_bits(ours, step(model, model.allocate_kv_cache(24, 8)))


def test_it_is_taken_where_it_applies_and_nowhere_else(model_dir, monkeypatch):
    model = load_llama(model_dir)
    calls = []
    run = cpu_decoder.DecoderPlan.run
    monkeypatch.setattr(cpu_decoder.DecoderPlan, "run",
                        lambda self, x, *a: calls.append(x.shape[0]) or run(self, x, *a))
    step(model, model.allocate_kv_cache(24, 8), new_rows=5)
    assert calls == [10]  # the prefill's 46 rows take the modules (more than cpu_gemm.MAX_ROWS), the step's 10 the call
    calls.clear()
    torch.set_num_threads(2)  # the kernels are single-threaded: with more threads the libraries run
    step(model, model.allocate_kv_cache(24, 8))
    assert calls == []
    torch.set_num_threads(1)
    assert cpu_gemm.MAX_ROWS == 16  # (the rows the few-row kernel takes; the prefill above is past it)


def test_the_kernels_errors_come_through(model_dir):
    model = load_llama(model_dir)
    caches = model.allocate_kv_cache(4, 8)
    kv = KVCacheManager(4, 8)
    kv.allocate("r", 0, 3)
    ids, meta = flatten(kv, [("r", [1, 2, 3], 0)])
    meta.slot_mapping[1] = 4 * 8  # one past the pool
    with pytest.raises(IndexError, match="outside the KV cache's 32 slots"):
        model(ids, meta, caches)
    ids, meta = flatten(kv, [("r", [1, 2, 3], 0)])
    meta.block_tables[0, 0] = -1
    with pytest.raises(ValueError, match="block table does not hold"):
        model(ids, meta, caches)


def test_the_switch_and_other_layers_keep_the_modules(model_dir, monkeypatch):
    monkeypatch.setenv(cpu_decoder.SWITCH, "0")
    model = load_llama(model_dir)
    assert model.decoder_plan is None and model.decoder_why == "SPECLAB_CPU_DECODER=0"
    monkeypatch.delenv(cpu_decoder.SWITCH)

    class Scaled(DecoderLayer):  # a subclass may compute something else: its own forward must run
        def forward(self, x, *args):
            return 2 * super().forward(x, *args)
    model = load_llama(model_dir)
    layer = Scaled(model.config)
    layer.load_state_dict(model.model.layers[1].state_dict())
    model.model.layers[1] = layer
    model.prepare()
    assert model.decoder_plan is None and "DecoderLayer" in model.decoder_why


def test_a_copy_of_the_model_reads_its_own_weights(model_dir):
    model = load_llama(model_dir)
    before = step(model, model.allocate_kv_cache(24, 8))[0]
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.model.layers[2].mlp.down.weight.mul_(0.5)  # in place: the copy's tensor, not the original's
    ours, theirs = both_paths(twin)
    assert same_bits(ours, theirs) and not torch.equal(ours[0], before)
    assert torch.equal(step(model, model.allocate_kv_cache(24, 8))[0], before)


@pytest.mark.real_model
@needs_smollm2_wheel()
def test_smollm2_one_call_gives_the_modules_bits():
    """The real model's 30 layers and its tied head, float32 (tests/test_05_row_invariance.py checks that
    a token's logits are the same bits decoded and verified, on this path)."""
    from speclab.models import smollm2
    model = load_llama(smollm2.model_dir())
    assert same_bits(*both_paths(model, hidden_layers=(2, 15, 27)))


@pytest.mark.parametrize("method", ["eagle", "mtp"])
def test_an_eagle_head_s_layer_takes_the_call_with_the_same_bits(model_dir, method):
    from speclab.models.heads import build_head, new_config
    target = load_llama(model_dir)
    torch.manual_seed(0)
    head = build_head(new_config(method, target), target).eval()
    kv = KVCacheManager(8, 8)
    kv.allocate("r", 0, 12)
    g = torch.Generator().manual_seed(1)
    feature = torch.randn(12, target.config.hidden_size, generator=g)
    ids = torch.randint(0, target.config.vocab_size, (12,), generator=g)

    def drafts():  # a 9-token pass, then two chained one-token steps over the same cache
        cache = head.allocate_kv_cache(8, 8)
        out = [head(ids[:9], feature[:9], flatten(kv, [("r", ids[:9].tolist(), 0)])[1], cache)]
        for t in (9, 10):
            out.append(head(ids[t:t + 1], out[-1][-1:], flatten(kv, [("r", [int(ids[t])], t)])[1], cache))
        return out, cache
    ours = drafts()
    assert head._plan is not None
    head._plan = None
    theirs = drafts()
    assert all(map(torch.equal, ours[0], theirs[0])) and all(map(torch.equal, ours[1], theirs[1]))
