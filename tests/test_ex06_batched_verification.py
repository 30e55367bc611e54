"""Grades exercise 06 (vLLM's spec-decode indices; greedy verification from the forward's logits).
`pytest --impl=exercises tests/test_ex06_batched_verification.py`. Negative controls at the bottom grade
the grader (skipped under --impl=exercises)."""

import pytest
import torch

from speclab.verify import rejection_sample
from tests.helpers import fail_on

EXERCISE = "ex06_batched_verification"
pytestmark = pytest.mark.exercise


# The worked example in vLLM's gpu_model_runner comments: 5 requests, two of them prefill chunks.
SCHEDULED, DRAFTS = [4, 100, 3, 100, 2], [3, 0, 2, 0, 1]
WANT = {"cu_num_draft_tokens": [3, 3, 5, 5, 6],
        "logits_indices": [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208],
        "target_logits_indices": [0, 1, 2, 5, 6, 9],
        "bonus_logits_indices": [3, 4, 7, 8, 10]}
WHY = {"cu_num_draft_tokens": "vLLM's cumulative sum is inclusive: request r's drafts end at cu[r], there is no leading 0",
       "logits_indices": "each request needs logits at its last 1 + k_r scheduled positions (a prefill chunk of 100 "
                         "needs only its last one), offset by the tokens scheduled before it",
       "target_logits_indices": "these index the *selected* rows (0 .. T + B - 1), not the forward's rows: each "
                                "request's first k_r selected rows",
       "bonus_logits_indices": "each request's last selected row"}


def check_indices(fn, scheduled=SCHEDULED, drafts=DRAFTS, want=WANT):
    got = fn(scheduled, drafts)
    for key, value in want.items():
        if list(got.get(key, [])) != value:
            return (f"num_scheduled_tokens {scheduled}, num_draft_tokens {drafts}: {key} should be {value}, got "
                    f"{got.get(key)}; {WHY[key]}")
    return None


def reference_indices(scheduled, drafts):
    logits, row, cu, verify, bonus, acc = [], 0, 0, [], [], []
    for n, k in zip(scheduled, drafts):
        cu += n
        logits += list(range(cu - 1 - k, cu))
        verify += list(range(row, row + k))
        bonus.append(row + k)
        row += k + 1
        acc.append(k + (acc[-1] if acc else 0))
    return {"cu_num_draft_tokens": acc, "logits_indices": logits, "target_logits_indices": verify,
            "bonus_logits_indices": bonus}


def random_step(seed):
    g = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 7, (1,), generator=g))
    V = int(torch.randint(2, 10, (1,), generator=g))
    ks = torch.randint(0, 5, (B,), generator=g).tolist()
    scheduled = [k + 1 + (int(torch.randint(0, 6, (1,), generator=g)) if k == 0 else 0) for k in ks]  # k = 0: a chunk
    logits = torch.randn(sum(scheduled), V, generator=g) * 3
    sel = reference_indices(scheduled, ks)
    target = logits[sel["logits_indices"]].softmax(-1)
    drafts = target[sel["target_logits_indices"]].argmax(-1) if sum(ks) else torch.empty(0, dtype=torch.long)
    flip = torch.rand(sum(ks), generator=g) < 0.3
    drafts = torch.where(flip, torch.randint(0, V, (sum(ks),), generator=g), drafts)
    return logits, scheduled, drafts, ks, target


def check_greedy(fn, seed):
    logits, scheduled, drafts, ks, target = random_step(seed)
    want = rejection_sample(drafts, ks, target, greedy=True)
    got = fn(logits, scheduled, drafts, ks)
    if not torch.is_tensor(got) or got.shape != want.shape or got.dtype != torch.int64:
        return f"return a (B, max_k + 1) = {tuple(want.shape)} int64 tensor padded with -1; got {got!r}"
    for r in range(len(ks)):
        if not torch.equal(got[r], want[r]):
            cu = sum(ks[:r])
            return (f"num_scheduled_tokens {scheduled}, num_draft_tokens {ks}: request {r} drafted "
                    f"{drafts[cu:cu + ks[r]].tolist()}, and the target's argmax at its {ks[r] + 1} selected rows "
                    f"(its last {ks[r] + 1} scheduled positions) is {target[sum(k + 1 for k in ks[:r]):][:ks[r] + 1].argmax(-1).tolist()}: "
                    f"keep drafts while they match, then the target's token, then -1 -> {want[r].tolist()}; got {got[r].tolist()}")
    return None


def test_indices_on_vllms_worked_example(impl):
    fail_on(check_indices(impl.spec_decode_indices))


@pytest.mark.parametrize("seed", range(10))
def test_indices_random(impl, seed):
    _, scheduled, _, ks, _ = random_step(seed)
    fail_on(check_indices(impl.spec_decode_indices, scheduled, ks, reference_indices(scheduled, ks)))


def test_indices_without_drafts(impl):
    fail_on(check_indices(impl.spec_decode_indices, [5, 1], [0, 0], reference_indices([5, 1], [0, 0])))


def test_greedy_by_hand(impl):
    # request 0: a prefill chunk of 3 tokens (k = 0); request 1: 1 + 2 tokens, first draft right, second wrong
    V = 8
    argmax_rows = [5, 5, 6, 1, 4, 7]  # the forward's 6 rows
    logits = torch.nn.functional.one_hot(torch.tensor(argmax_rows), V).float()
    out = impl.greedy_verify_batch(logits, [3, 3], torch.tensor([1, 2]), [0, 2])
    if out.tolist() != [[6, -1, -1], [1, 4, -1]]:
        pytest.fail(f"request 0 (3 prefill tokens, k = 0) samples from its last row (2): 6; request 1's rows are 3..5: "
                    f"draft 1 == argmax 1 is kept, draft 2 != argmax 4 so 4 replaces it -> [[6, -1, -1], [1, 4, -1]]; "
                    f"got {out.tolist()}", pytrace=False)


@pytest.mark.parametrize("seed", range(25))
def test_greedy_matches_rejection_sample(impl, seed):
    fail_on(check_greedy(impl.greedy_verify_batch, seed))


# ---------------------------------------------------------------------------------------------
# Negative controls


def exclusive_cumsum(scheduled, drafts):
    """BUG: lesson 06's exclusive cu_r instead of vLLM's inclusive cu_num_draft_tokens."""
    d = reference_indices(scheduled, drafts)
    d["cu_num_draft_tokens"] = [c - k for c, k in zip(d["cu_num_draft_tokens"], drafts)]
    return d


def first_positions(scheduled, drafts):
    """BUG: logits at each request's *first* 1 + k scheduled positions."""
    d = reference_indices(scheduled, drafts)
    starts = [sum(scheduled[:r]) for r in range(len(scheduled))]
    d["logits_indices"] = [s + j for s, k in zip(starts, drafts) for j in range(k + 1)]
    return d


def forward_rows_as_targets(scheduled, drafts):
    """BUG: target/bonus indices counted in the forward's rows instead of the selected rows."""
    d = reference_indices(scheduled, drafts)
    sel = d["logits_indices"]
    d["target_logits_indices"] = [sel[i] for i in d["target_logits_indices"]]
    d["bonus_logits_indices"] = [sel[i] for i in d["bonus_logits_indices"]]
    return d


def greedy_without_selection(logits, scheduled, drafts, ks):
    """BUG: treats the forward's rows as if they were already k_r + 1 per request."""
    return rejection_sample(drafts, ks, logits[:sum(ks) + len(ks)].softmax(-1), greedy=True)


def greedy_keeps_matching_after_a_miss(logits, scheduled, drafts, ks):
    """BUG: keeps every draft that matches its row, even after a mismatch."""
    sel = reference_indices(scheduled, ks)
    best = logits[sel["logits_indices"]].argmax(-1).tolist()
    out = torch.full((len(ks), max(ks) + 1), -1)
    row, cu = 0, 0
    for r, k in enumerate(ks):
        kept = [int(drafts[cu + i]) for i in range(k) if int(drafts[cu + i]) == best[row + i]]
        n = len(kept)
        out[r, :n + 1] = torch.tensor(kept + [best[row + n]])
        row, cu = row + k + 1, cu + k
    return out


@pytest.mark.parametrize("fn", [exclusive_cumsum, first_positions, forward_rows_as_targets], ids=lambda f: f.__name__)
def test_control_index_check_catches(controls, fn):
    message = check_indices(fn)
    assert message is not None
    print(message)


@pytest.mark.parametrize("fn", [greedy_without_selection, greedy_keeps_matching_after_a_miss], ids=lambda f: f.__name__)
def test_control_greedy_check_catches(controls, fn):
    message = next((m for seed in range(25) if (m := check_greedy(fn, seed))), None)
    assert message is not None
    print(message)
