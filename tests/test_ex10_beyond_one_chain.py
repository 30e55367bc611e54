"""Grades exercise 10 (beyond one chain). `pytest --impl=exercises tests/test_ex10_beyond_one_chain.py`.

Each answer is checked against speclab's own function on the same inputs (speclab.verify.block for
block verification, speclab.verify.tree for the tree's layout and walk, the model runner's `_compact`
for KV compaction), or against the target's law (sibling verification, the law check). The checks
name the classic mistakes: block verification that stops at the first failure, a tree mask that lets
siblings see each other, KV compaction off by one, deterministic children tested against the original
p instead of what is left, with-replacement siblings verified with the without-replacement update, and a
lossy rule (typical acceptance) labelled lossless. The negative
controls at the bottom run each of those wrong answers through the same checks and show every one
is caught, with its name in the message (skipped under --impl=exercises).

Statistical checks are seeded and state their power: the sibling law check (N = 4,000 per case and
scheme, V = 4) detects a TV of 0.053 with power 0.99 at p < 1e-4; the wrong updates it must catch are
at TV 0.25 and 0.16 on its two cases. The rule law check (N = 6,000 requests, V = 4) detects 0.044;
typical acceptance is at TV 0.70 (Medusa's defaults) and 0.07 (eps = 0.3) from the target there.
"""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.engine.model_runner import ModelRunner
from speclab.kv_cache import KVCacheManager
from speclab.verify import block, rejection, typical
from speclab.verify.tree import TokenTree, draw_children, from_parents, parse_tree, sample_tree, walk
from speclab.verify.tree import recursive_rejection_sample as speclab_rrs
from tests.helpers import fail_on

EXERCISE = "ex10_beyond_one_chain"
pytestmark = pytest.mark.exercise
F64 = torch.float64


# ---------------------------------------------------------------------------------------------
# 1. block verification, against speclab.verify.block.rejection_sample


def block_cases():
    """(name, drafts (N, k), p (N, k+1, V), q (N, k, V), u (N, k), noise (N, V)): random batches and edges."""
    g = torch.Generator().manual_seed(10)
    cases = []
    for i in range(120):
        N, k, V = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(0, 7, (1,), generator=g)), \
            int(torch.randint(2, 12, (1,), generator=g))
        p = (1.5 * torch.randn(N, k + 1, V, generator=g, dtype=F64)).softmax(-1)
        q = (2.5 * torch.randn(N, k, V, generator=g, dtype=F64)).softmax(-1)
        x = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(N, k) if k else torch.zeros(N, 0, dtype=torch.long)
        u = torch.rand(N, k, generator=g, dtype=F64).clamp(1e-9, 1 - 1e-9)
        e = torch.empty(N, V, dtype=F64).exponential_(1.0, generator=g)
        cases.append((f"random batch {i} (N={N}, k={k}, V={V})", x, p, q, u, e))
    # the lesson's crux: draft 1 fails its test (u = 0.9 > 1/2), draft 2 rescues the block (rho_2 = 1)
    p = torch.tensor([[[0.25, 0.75], [0.0, 1.0], [0.5, 0.5]]], dtype=F64)
    q = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=F64)
    cases.append(("the lesson's crux: draft 1's test fails, draft 2's passes, so both are kept", torch.tensor([[0, 1]]),
                  p, q, torch.tensor([[0.9, 0.9]], dtype=F64), torch.ones(1, 2, dtype=F64)))
    # draft 1 kept with rho_1 = 1/2 < 1, draft 2 refused: the residual is max(rho_1 p_2 - q_2, 0), whose
    # support ({0}) differs from the token-wise max(p_2 - q_2, 0)'s ({0, 1})
    p = torch.tensor([[[0.25, 0.75, 0.0], [0.6, 0.4, 0.0], [0.2, 0.3, 0.5]]], dtype=F64)
    q = torch.tensor([[[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]], dtype=F64)
    cases.append(("draft 1 kept with rho_1 = 1/2, draft 2 refused", torch.tensor([[0, 2]]), p, q,
                  torch.tensor([[0.05, 0.5]], dtype=F64), torch.tensor([[10.0, 0.01, 1.0]], dtype=F64)))
    same = torch.full((1, 4, 3), 1 / 3, dtype=F64)
    cases.append(("p == q: every draft kept, bonus from the last row", torch.tensor([[2, 0, 1]]), same, same[:, :3],
                  torch.tensor([[0.99, 0.99, 0.99]], dtype=F64), torch.tensor([[1.0, 0.5, 2.0]], dtype=F64)))
    return cases


def reference_block(x, p, q, u, e):
    N, k = x.shape
    V = p.shape[-1]
    return block.rejection_sample(x.reshape(-1), [k] * N, p.reshape(-1, V), q.reshape(-1, V) if k else None,
                                  uniforms=u.reshape(-1), noise=e)


def check_block(m) -> str | None:
    for name, x, p, q, u, e in block_cases():
        want = reference_block(x, p, q, u, e)
        got = torch.as_tensor(m.block_verify_batch(x.clone(), p.clone(), q.clone(), u.clone(), e.clone()))
        if got.shape != want.shape:
            return f"block_verify_batch, {name}: the output must be (N, k + 1) = {tuple(want.shape)}, got {tuple(got.shape)}"
        for r in range(x.shape[0]):
            w, o = want[r], got[r].long()
            if torch.equal(w, o):
                continue
            tau, n_got = int((w >= 0).sum()) - 1, int((o >= 0).sum()) - 1
            h = block_thresholds(x[r], p[r], q[r])
            first_fail = int((u[r] <= h).long().cumprod(0).sum())
            if n_got != tau:
                if n_got == first_fail:
                    what = (f"your answer stops at the first failure (kept {n_got}), but block verification keeps the "
                            f"LAST position that passes, tau = max{{i : u_i <= h_i}} = {tau}: a failed test does not end "
                            f"the walk (h = {[round(float(v), 3) for v in h]}, u = {[round(float(v), 3) for v in u[r]]})")
                else:
                    what = (f"tau should be {tau} (the last i with u_i <= h_i, h = {[round(float(v), 3) for v in h]}), "
                            f"got {n_got}: rho_i = min(rho_(i-1) p_i(X_i) / q_i(X_i), 1) (0 where q_i(X_i) = 0), "
                            f"h_i = Z / (Z + 1 - rho_i) with Z = sum max(rho_i p_(i+1) - q_(i+1), 0), and h_k = rho_k")
            elif tau == x.shape[1]:
                what = "every draft kept: the last token is the bonus, argmax p_k / noise from the bonus row"
            else:
                what = (f"tau = {tau}: the token after the kept drafts comes from the block residual "
                        f"max(rho_tau p_tau - q_tau, 0) / noise (rho_tau times p, not the token-wise max(p - q, 0); "
                        f"p_tau itself when it is all zero)")
            return f"block_verify_batch, {name}, row {r}: want {w.tolist()}, got {o.tolist()}; {what}"
    return None


def block_thresholds(x, p, q):
    """(k,) h for one request, from speclab's pieces (for the grader's diagnosis)."""
    k = x.shape[0]
    rho, h = [torch.ones(1, dtype=F64)], []
    for i in range(k):
        rho.append(block.prefix_ratio(rho[-1], p[i, x[i]].reshape(1), q[i, x[i]].reshape(1)))
    for i in range(1, k + 1):
        if i < k:
            z = block.block_residual(rho[i], p[i:i + 1], q[i:i + 1]).sum()
            d = z + 1 - rho[i][0]
            h.append(float(z / d) if d > 0 else 1.0)
        else:
            h.append(float(rho[k][0]))
    return torch.tensor(h, dtype=F64)


# ---------------------------------------------------------------------------------------------
# 2. the tree's layout and its walk, against speclab.verify.tree


LITERALS = [
    "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]",  # vLLM's example
    "[(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]",  # a chain
    "[(1, 0), (0,), (0, 1), (1,), (2,), (0, 0)]",  # not breadth first: must be sorted as vLLM sorts
    "[(0,), (1,), (2,), (3,)]",  # one level of four siblings
    "[(0,), (0, 0), (0, 1), (0, 2), (0, 1, 0), (0, 1, 1), (1,)]",
]


def random_parents(rng, n):
    return [-1] + [rng.randrange(0, i) for i in range(1, n + 1)]


def check_layout(m) -> str | None:
    for lit in LITERALS:
        want = list(parse_tree(lit).parents)
        got = [int(v) for v in m.tree_parents(lit)]
        if got != want:
            return (f"tree_parents({lit}) should be {want}, got {got}: number the nodes breadth first (sorted by "
                    f"depth, then by path, as vLLM sorts the literal), node 0 the root with parent -1")
    rng = random.Random(10)
    trees = [parse_tree(lit) for lit in LITERALS] + [from_parents(random_parents(rng, rng.randint(1, 9)))
                                                    for _ in range(30)]
    for tree in trees:
        parents, start = list(tree.parents), rng.randint(0, 40)
        want_pos = [start + d for d in tree.depths]
        got_pos = [int(v) for v in m.tree_positions(list(parents), start)]
        if got_pos != want_pos:
            hint = ("positions by slot index (start + i) are a chain's positions: a node's position is the root's plus "
                    "its depth, and siblings share one" if got_pos == list(range(start, start + len(parents)))
                    else "a node's position is the root's (start) plus its depth")
            return f"tree_positions({parents}, start={start}) should be {want_pos}, got {got_pos}: {hint}"
        want = tree.attention_mask()
        got = torch.as_tensor(m.tree_attention_mask(list(parents))).bool()
        if got.shape != want.shape or not torch.equal(got, want):
            return f"tree_attention_mask({parents}): {explain_mask(tree, got, want)}"
    return None


def explain_mask(tree: TokenTree, got, want) -> str:
    if got.shape != want.shape:
        return f"the mask is (N + 1, N + 1) = {tuple(want.shape)}, got {tuple(got.shape)}"
    for i, j in zip(*torch.nonzero(got != want, as_tuple=True)):
        i, j = int(i), int(j)
        if got[i, j] and j not in tree.ancestors(i):
            if tree.parents[i] == tree.parents[j] or tree.depths[j] == tree.depths[i]:
                kind = "its sibling" if tree.parents[i] == tree.parents[j] else "a node of the same depth on another branch"
                return (f"node {i} sees node {j}, {kind}: the mask lets siblings see each other (a causal mask over the "
                        f"slots does). A node sees only itself and its ancestors {tree.ancestors(i)}; siblings are "
                        f"alternatives at one position, not a sequence")
            return (f"node {i} sees node {j}, which is not one of its ancestors {tree.ancestors(i)}: a node sees only its "
                    f"own path from the root")
        return (f"node {i} must see node {j} (its path from the root is {tree.ancestors(i)}, itself included, so that "
                f"its draft was conditioned on them)")
    return "the mask differs"


def walk_cases():
    rng = random.Random(11)
    cases = []
    for lit in LITERALS:
        cases.append((parse_tree(lit), rng))
    for _ in range(60):
        cases.append((from_parents(random_parents(rng, rng.randint(1, 10))), rng))
    out = []
    for tree, _ in cases:
        V = rng.choice([2, 3, 5])
        tokens = [rng.randrange(V) for _ in range(tree.num_nodes)]
        targets = [rng.randrange(V) for _ in range(tree.num_nodes + 1)]
        out.append((tree, tokens, targets))
    return out


def check_walk(m) -> str | None:
    for tree, tokens, targets in walk_cases():
        want = walk(tree, tokens, targets)
        got = m.greedy_tree_walk(list(tree.parents), list(tokens), list(targets))
        got = ([int(v) for v in got[0]], [int(v) for v in got[1]])
        if got != want:
            return (f"greedy_tree_walk(parents={list(tree.parents)}, tokens={tokens}, targets={targets}) should be "
                    f"{want}, got {got}: from the root, step into the child whose draft equals the target's token at "
                    f"the node (targets[node]), continue inside that child's subtree only, and end with the target's "
                    f"token at the last accepted node")
    return None


# ---------------------------------------------------------------------------------------------
# 3. KV compaction, against the model runner's _compact (non-contiguous block tables)


def runner_compact(kv: KVCacheManager, caches, rid: str, start: int, path: list[int]):
    """speclab's own compaction: ModelRunner._compact on a stand-in runner and scheduled request."""
    runner = SimpleNamespace(kv=kv, device="cpu", kv_caches=caches)
    ModelRunner._compact(runner, SimpleNamespace(request=SimpleNamespace(request_id=rid), start=start), path)


def random_path(rng, tree: TokenTree) -> list[int]:
    node, path = 0, []
    while tree.children[node] and rng.random() < 0.8:
        node = rng.choice(tree.children[node])
        path.append(node)
    return path


def check_compact(m) -> str | None:
    rng = random.Random(12)
    for case in range(60):
        tree = parse_tree(rng.choice(LITERALS)) if case % 2 else from_parents(random_parents(rng, rng.randint(1, 9)))
        path = random_path(rng, tree) if case else [1]
        bs, H, D = rng.randint(1, 5), 2, 3
        start = rng.randint(0, 12)
        length = start + tree.num_nodes + 1
        kv = KVCacheManager(64, bs)
        table = list(range(64))
        rng.shuffle(table)
        kv.block_tables["r"] = table[:kv.blocks_for(length)]
        caches = [(torch.randn(64, bs, H, D), torch.randn(64, bs, H, D))]
        slots = torch.tensor(kv.slot_mapping("r", 0, length))
        before = caches[0][0].view(-1, H, D)[slots].clone()  # (length, H, D) by position
        runner_compact(kv, caches, "r", start, path)
        after = caches[0][0].view(-1, H, D)[slots]
        n_keep = start + 1 + len(path)
        got, got_n = m.compact_kv(before.clone(), start, list(path))
        got = torch.as_tensor(got)
        where = f"compact_kv(start={start}, path={path}) for the tree {tree.paths()}"
        if int(got_n) != n_keep:
            return (f"{where}: the cache's valid length after the step is start + 1 + len(path) = {n_keep} (the "
                    f"committed tokens through the root, then the accepted drafts), got {int(got_n)}: off by one "
                    f"{'(the root at position start is kept: it is the last committed token)' if int(got_n) == n_keep - 1 else ''}")
        if got.shape[0] < n_keep or not torch.equal(got[:n_keep], after[:n_keep]):
            bad = next(t for t in range(n_keep) if got.shape[0] <= t or not torch.equal(got[t], after[t]))
            hint = ""
            if bad < start + 1:
                hint = (f"position {bad} is {'the root' if bad == start else 'the committed past'}: it must not move "
                        f"(an accepted node moved to start + j lands one slot too early, over the root: off by one)")
            else:
                j = bad - start - 1
                if start + path[j] - 1 < before.shape[0] and torch.equal(got[bad], before[start + path[j] - 1]):
                    hint = (f"it holds the KV of slot start + {path[j]} - 1: node i was written at start + i (node 0, "
                            f"the root, at start), so node {path[j]} is read from start + {path[j]}: off by one")
                else:
                    hint = (f"accepted node path[{j}] = {path[j]} (written at start + {path[j]}) moves to "
                            f"start + 1 + {j} = {bad}")
            return f"{where}: position {bad} is wrong; {hint}"
    return None


# ---------------------------------------------------------------------------------------------
# 4. sibling verification (recursive rejection sampling), against a reference and the target's law


def speclab_top_k(p, children, u, noise):
    """speclab's rule for deterministic children (speclab.verify.tree.sample_tree on a root with these
    children, the same uniforms); the token after a rejection of every child by the race over p_left."""
    m, V = len(children), p.shape[0]
    star = TokenTree((-1,) + (0,) * m, tuple(range(m + 1)))
    path, _ = sample_tree(star, children, p[None].expand(m + 1, V), uniforms=[float(x) for x in u],
                          generator=torch.Generator().manual_seed(0))
    if path:
        return path[0] - 1, int(children[path[0] - 1])
    left = p.double().clone()
    left[list(children)] = 0.0
    left = left if float(left.sum()) > 0 else p.double()
    return -1, int((left / noise.double()).argmax())


def top_k_original_p(p, children, u, noise):
    """BUG: accepts child x iff u < p(x), the original p, instead of p_left(x) / mass left."""
    left = p.double().clone()
    for i, x in enumerate(children):
        if float(u[i]) < float(p[x]):
            return i, int(x)
        left[x] = 0.0
    return -1, int((left / noise.double()).argmax())


def top_k_no_zeroing(p, children, u, noise):
    """BUG: a rejected child keeps its mass: later tests and the final token use p itself."""
    for i, x in enumerate(children):
        if float(u[i]) < float(p[x]):
            return i, int(x)
    return -1, int((p.double() / noise.double()).argmax())


def check_top_k(m, n_law=3000) -> str | None:
    g = torch.Generator().manual_seed(18)
    for c in range(300):
        V = int(torch.randint(2, 9, (1,), generator=g))
        p = (1.5 * torch.randn(V, generator=g, dtype=F64)).softmax(-1)
        q = (1.5 * torch.randn(V, generator=g, dtype=F64)).softmax(-1)
        mm = int(torch.randint(1, V + 1, (1,), generator=g))
        children = q.argsort(descending=True)[:mm].tolist()
        if c % 10 == 9 and mm > 1:
            children[-1] = children[0]  # a repeated token: its mass is already 0 the second time
        u = torch.rand(mm, generator=g, dtype=F64)
        noise = torch.empty(V, dtype=F64).exponential_(1.0, generator=g)
        want = speclab_top_k(p, children, u, noise)
        got = m.top_k_children_verify(p.clone(), list(children), u.clone(), noise.clone())
        got = (int(got[0]), int(got[1]))
        if got == want:
            continue
        if want[0] == -1 and got[0] == -1:
            what = ("every child was rejected: the token is argmax p_left / noise, where p_left is p with every child "
                    "set to 0 (set p_left(x) = 0 as each is rejected: the target's distribution given that the token "
                    "is none of them)")
        elif got == top_k_no_zeroing(p, children, u, noise) or got == top_k_original_p(p, children, u, noise):
            what = ("after a child is rejected set p_left(x) = 0 and test the next child with p_left(x) / (mass left): "
                    "each test is 'is it this token, given it is none of the ones already refused?' (testing against "
                    "the original p(x) under-accepts every child after the first)")
        else:
            what = "accept child x iff u * (mass left) < p_left(x), trying the children in rank order"
        return (f"top_k_children_verify, case {c} (p = {[round(float(v), 3) for v in p]}, children {children}, "
                f"u = {[round(float(v), 3) for v in u]}): want {want}, got {got}; {what}")
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    children = [1, 2]
    counts = np.zeros(4)
    for _ in range(n_law):
        u = torch.rand(2, generator=g, dtype=F64)
        noise = torch.empty(4, dtype=F64).exponential_(1.0, generator=g)
        counts[int(m.top_k_children_verify(p, list(children), u, noise)[1])] += 1
    pv = stats.chi2_gof(counts, p.numpy())
    if pv < 1e-4:
        return (f"the law check failed: children {children} at p = {p.tolist()} emitted {np.round(counts / n_law, 3).tolist()} "
                f"(chi2 p-value {pv:.1e}); the token a node emits must be distributed as p")
    return None


def reference_rrs(p, drafts, q, u, noise, without_replacement):
    """speclab.verify.tree.recursive_rejection_sample with explicit uniforms and noise (its law is also
    checked against speclab's own draws in test_controls_reference_rrs_law)."""
    return speclab_rrs(p, [int(x) for x in drafts], q, without_replacement=without_replacement, uniforms=u,
                       noise=noise)


SIBLING_CASES = [  # (p, q, m): the target and draft at one node, m siblings
    ([0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1], 3),  # i.i.d. siblings verified as without: TV 0.25
    ([0.1, 0.1, 0.1, 0.7], [0.45, 0.45, 0.05, 0.05], 3),  # without-replacement siblings verified as i.i.d.: TV 0.16
]


def _scheme(wr: bool) -> str:
    return "without replacement" if wr else "with replacement (i.i.d.)"


def check_rrs(m) -> str | None:
    g = torch.Generator().manual_seed(13)
    for c in range(300):
        V = int(torch.randint(2, 8, (1,), generator=g))
        p = (1.5 * torch.randn(V, generator=g, dtype=F64)).softmax(-1)
        q = (1.5 * torch.randn(V, generator=g, dtype=F64)).softmax(-1)
        wr = bool(c % 2)
        mm = int(torch.randint(1, min(4, V) + 1, (1,), generator=g))
        drafts = draw_children(q, mm, replacement=not wr, generator=g)
        u = torch.rand(mm, generator=g, dtype=F64)
        noise = torch.empty(V, dtype=F64).exponential_(1.0, generator=g)
        want = reference_rrs(p, drafts, q, u, noise, wr)
        got = m.recursive_rejection_sample(p.clone(), list(drafts), q.clone(), u.clone(), noise.clone(), wr)
        got = (int(got[0]), int(got[1]))
        if got != want:
            other = reference_rrs(p, drafts, q, u, noise, not wr)
            if got == other:
                what = (f"the siblings were drawn {_scheme(wr)} and your answer applies the update for siblings drawn "
                        f"{_scheme(not wr)}: " + (
                            "with-replacement siblings verified with the without-replacement update (the classic bug): "
                            "i.i.d. siblings were each drawn from q itself, so every test uses q, not q with the earlier "
                            "siblings removed" if not wr else
                            "siblings drawn without replacement were each drawn from q with the earlier ones removed and "
                            "renormalised; that is the proposal each test must use"))
            else:
                what = ("accept sibling x with min(1, r(x) / prop(x)) (u * prop(x) < r(x)), where r starts as p and "
                        "after a rejection becomes norm(max(r - prop, 0)); if none is accepted, the token is "
                        "argmax r / noise")
            return (f"recursive_rejection_sample, case {c} (V={V}, siblings {drafts} drawn {_scheme(wr)}): want {want}, "
                    f"got {got}; {what}")
    return None


N_LAW = 4_000


def check_sibling_law(m, n=N_LAW) -> str | None:
    """The emitted token's law at one node must be p, for either way of drawing the siblings."""
    g = torch.Generator().manual_seed(14)
    for p, q, mm in SIBLING_CASES:
        p, q = torch.tensor(p, dtype=F64), torch.tensor(q, dtype=F64)
        for wr in (False, True):
            counts = np.zeros(len(p))
            for _ in range(n):
                drafts = draw_children(q, mm, replacement=not wr, generator=g)
                u = torch.rand(mm, generator=g, dtype=F64)
                noise = torch.empty(len(p), dtype=F64).exponential_(1.0, generator=g)
                counts[int(m.recursive_rejection_sample(p, drafts, q, u, noise, wr)[1])] += 1
            pv = stats.chi2_gof(counts, p.numpy())
            if pv < 1e-4:
                return (f"the law check failed for {mm} siblings drawn {_scheme(wr)} (p = {p.tolist()}, q = {q.tolist()}): "
                        f"emitted {np.round(counts / n, 3).tolist()}, chi2 p-value {pv:.1e}; the token a node emits must "
                        f"be distributed as p. If the siblings were drawn with replacement, check that you did not use "
                        f"the without-replacement update (with-replacement siblings verified as without)")
    return None


# ---------------------------------------------------------------------------------------------
# 5. the law check itself: exact rules pass it, a lossy one fails it


LAW_P = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float32)
LAW_Q = torch.tensor([[0.05, 0.05, 0.1, 0.8], [0.6, 0.2, 0.1, 0.1]], dtype=torch.float32)
N_RULE = 6_000


def law_rules():
    """(name, rule, exact?)."""
    return [("the standard rule (speclab.verify.rejection)", rejection.rejection_sample, True),
            ("block verification (speclab.verify.block)", block.rejection_sample, True),
            ("typical acceptance (Medusa: eps = 0.09, delta = 0.3)", typical.rejection_sample, False),
            ("typical acceptance with eps = 0.3 (a stricter threshold, still lossy)",
             lambda *a, **kw: typical.rejection_sample(*a, posterior_threshold=0.3, posterior_alpha=0.55, **kw), False)]


def check_law(m) -> str | None:
    for name, rule, exact in law_rules():
        pv = float(m.first_token_p_value(rule, LAW_P.clone(), LAW_Q.clone(), N_RULE, torch.Generator().manual_seed(15)))
        if exact and pv < 1e-4:
            return (f"first_token_p_value says {name} is not exact (p-value {pv:.1e} < 1e-4), but it is: an exact rule "
                    f"labelled lossy. The first token of every request (accepted draft, recovered or bonus) must be "
                    f"tested against the target's first row p[0], not the draft's, and not only where a draft was accepted")
        if not exact and pv >= 1e-4:
            return (f"first_token_p_value gives {name} a p-value of {pv:.2g} >= 1e-4: a lossy rule labelled lossless. "
                    f"Its first token is the draft whenever the draft clears a threshold, so its law is not p[0] "
                    f"(TV {typical_first_token_tv(rule):.2f} here). Use all n requests' first tokens, test them against "
                    f"p[0]; a higher acceptance rate is not evidence that a rule is right")
    return None


def typical_first_token_tv(rule, n=20_000) -> float:
    g = torch.Generator().manual_seed(16)
    k, V = LAW_Q.shape
    drafts = torch.multinomial(LAW_Q, n, replacement=True, generator=g).T.reshape(-1)
    out = rule(drafts, [k] * n, LAW_P.repeat(n, 1), LAW_Q.repeat(n, 1), generator=g)
    return stats.tv_distance(np.bincount(out[:, 0].numpy(), minlength=V) / n, LAW_P[0])


# ---------------------------------------------------------------------------------------------
# the grades


def test_block_verification(impl):
    fail_on(check_block(impl))


def test_tree_layout(impl):
    fail_on(check_layout(impl))


def test_greedy_tree_walk(impl):
    fail_on(check_walk(impl))


def test_kv_compaction(impl):
    fail_on(check_compact(impl))


def test_deterministic_children(impl):
    fail_on(check_top_k(impl))


def test_sibling_verification(impl):
    fail_on(check_rrs(impl))


def test_sibling_law(impl):
    fail_on(check_sibling_law(impl))


def test_law_check_tells_exact_from_lossy(impl):
    fail_on(check_law(impl))


# ---------------------------------------------------------------------------------------------
# negative controls: wrong answers the checks above must catch, each named in the message


class Mutant:
    def __init__(self, **overrides):
        import solutions.ex10_beyond_one_chain as sol
        self._sol, self._over = sol, overrides

    def __getattr__(self, name):
        return self._over.get(name) or getattr(self._sol, name)


def caught(check, needle, **overrides):
    msg = check(Mutant(**overrides))
    assert msg and needle in msg, f"the grader missed a wrong {sorted(overrides)} (or named it wrongly): {msg}"
    print(f"{sorted(overrides)}: {msg}")


def first_failure_verify(x, p, q, u, e):
    """BUG: speclab's block rule with tau = the run of leading passes (stops at the first failure)."""
    N, k = x.shape
    V = p.shape[-1]
    real = block.last_passing
    block.last_passing = lambda passed: passed.long().cumprod(1).sum(1)
    try:
        return block.rejection_sample(x.reshape(-1), [k] * N, p.reshape(-1, V), q.reshape(-1, V) if k else None,
                                      uniforms=u.reshape(-1), noise=e)
    finally:
        block.last_passing = real


def token_wise_residual_verify(x, p, q, u, e):
    """BUG: block verification's tau, but the token-wise residual max(p - q, 0) after it."""
    import solutions.ex10_beyond_one_chain as sol
    out = sol.block_verify_batch(x, p, q, u, e)
    N, k = x.shape
    for r in range(N):
        tau = int((out[r] >= 0).sum()) - 1
        if tau < k:
            res = (p[r, tau] - q[r, tau]).clamp(min=0)
            res = res if float(res.max()) > 0 else p[r, tau]
            out[r, tau] = int((res / e[r]).argmax())
    return out


def test_controls_block(controls):
    import solutions.ex10_beyond_one_chain as sol
    assert check_block(sol) is None
    caught(check_block, "stops at the first failure", block_verify_batch=first_failure_verify)
    caught(check_block, "block residual", block_verify_batch=token_wise_residual_verify)


def causal_mask(parents):
    """BUG: the chain's causal mask over the tree's slots: siblings see each other."""
    n = len(parents)
    return torch.tril(torch.ones(n, n, dtype=torch.bool))


def mask_without_self(parents):
    """BUG: ancestors only, the node itself left out."""
    import solutions.ex10_beyond_one_chain as sol
    return sol.tree_attention_mask(parents) & ~torch.eye(len(parents), dtype=torch.bool)


def positions_by_slot(parents, start):
    """BUG: a chain's positions."""
    return [start + i for i in range(len(parents))]


def parents_unsorted(literal):
    """BUG: nodes numbered in the literal's order, not breadth first."""
    import ast
    paths = [tuple(t) for t in ast.literal_eval(literal)]
    index = {t: i + 1 for i, t in enumerate(paths)}
    return [-1] + [index[t[:-1]] if len(t) > 1 else 0 for t in paths]


def test_controls_layout(controls):
    caught(check_layout, "lets siblings see each other", tree_attention_mask=causal_mask)
    caught(check_layout, "must see node", tree_attention_mask=mask_without_self)
    caught(check_layout, "siblings share one", tree_positions=positions_by_slot)
    caught(check_layout, "breadth first", tree_parents=parents_unsorted)


def walk_keeps_going_after_miss(parents, tokens, targets):
    """BUG: follows the first child even when it does not match (a chain's walk of rank-0 drafts)."""
    node, path = 0, []
    while True:
        kids = [c for c in range(1, len(parents)) if parents[c] == node]
        if not kids or tokens[kids[0] - 1] != targets[node]:
            return path, [tokens[c - 1] for c in path] + [targets[node]]
        path.append(kids[0])
        node = kids[0]


def test_controls_walk(controls):
    caught(check_walk, "the child whose draft equals", greedy_tree_walk=walk_keeps_going_after_miss)


def compact_to_start_plus_j(kv, start, path):
    """BUG (off by one): node path[j] moved to start + j, over the root."""
    out = kv.clone()
    for j, node in enumerate(path):
        out[start + j] = kv[start + node]
    return out, start + 1 + len(path)


def compact_reads_node_minus_one(kv, start, path):
    """BUG (off by one): node i read from start + i - 1, as if the root were not in the cache."""
    out = kv.clone()
    for j, node in enumerate(path):
        out[start + 1 + j] = kv[start + node - 1]
    return out, start + 1 + len(path)


def compact_length_without_root(kv, start, path):
    """BUG (off by one): the valid length forgets the root."""
    import solutions.ex10_beyond_one_chain as sol
    out, n = sol.compact_kv(kv, start, path)
    return out, n - 1


def test_controls_compact(controls):
    caught(check_compact, "off by one", compact_kv=compact_to_start_plus_j)
    caught(check_compact, "off by one", compact_kv=compact_reads_node_minus_one)
    caught(check_compact, "off by one", compact_kv=compact_length_without_root)


def top_k_end_from_p(p, children, u, noise):
    """BUG: the right tests, but after every child is rejected the token is raced over p, not p_left."""
    import solutions.ex10_beyond_one_chain as sol
    i, t = sol.top_k_children_verify(p, children, u, noise)
    return (i, t) if i >= 0 else (-1, int((p.double() / noise.double()).argmax()))


def test_controls_top_k(controls):
    import solutions.ex10_beyond_one_chain as sol
    assert check_top_k(sol) is None
    caught(check_top_k, "set p_left(x) = 0", top_k_children_verify=top_k_no_zeroing)
    caught(check_top_k, "mass left", top_k_children_verify=top_k_original_p)
    caught(check_top_k, "argmax p_left / noise", top_k_children_verify=top_k_end_from_p)


def rrs_always_without(p, drafts, q, u, noise, without_replacement):
    """BUG (the classic one): every sibling list verified with the without-replacement update."""
    return reference_rrs(p, drafts, q, u, noise, True)


def rrs_always_with(p, drafts, q, u, noise, without_replacement):
    """BUG: siblings drawn without replacement verified against q every time."""
    return reference_rrs(p, drafts, q, u, noise, False)


def test_controls_siblings(controls):
    import solutions.ex10_beyond_one_chain as sol
    assert check_rrs(sol) is None
    caught(check_rrs, "with-replacement siblings verified with the without-replacement update",
           recursive_rejection_sample=rrs_always_without)
    caught(check_rrs, "drawn without replacement were each drawn", recursive_rejection_sample=rrs_always_with)


@pytest.mark.slow  # ~10 s: it grades the grader
def test_controls_sibling_law(controls):
    """The law check alone (no reference to compare with) catches both wrong updates."""
    import solutions.ex10_beyond_one_chain as sol
    assert check_sibling_law(sol) is None
    print(f"detects TV >= {stats.min_detectable_tv(N_LAW, 4):.3f} (power 0.99, p < 1e-4)")
    caught(check_sibling_law, "with replacement (i.i.d.)", recursive_rejection_sample=rrs_always_without)
    caught(check_sibling_law, "without replacement", recursive_rejection_sample=rrs_always_with)


@pytest.mark.slow  # ~8 s: it grades the grader's reference
def test_controls_reference_rrs_law(controls):
    """The grader's reference_rrs has speclab's law: two-sample chi-squared against speclab's own function."""
    g = torch.Generator().manual_seed(17)
    for p, q, mm in SIBLING_CASES:
        p, q = torch.tensor(p, dtype=F64), torch.tensor(q, dtype=F64)
        for wr in (False, True):
            a, b = np.zeros(len(p)), np.zeros(len(p))
            for _ in range(3000):
                d = draw_children(q, mm, replacement=not wr, generator=g)
                a[speclab_rrs(p, d, q, without_replacement=wr, generator=g)[1]] += 1
                d = draw_children(q, mm, replacement=not wr, generator=g)
                b[reference_rrs(p, d, q, torch.rand(mm, generator=g, dtype=F64),
                                torch.empty(len(p), dtype=F64).exponential_(1.0, generator=g), wr)[1]] += 1
            assert stats.chi2_two_sample(a, b) > 1e-4, (p, q, wr, a, b)


def p_value_few_samples(rule, p, q, n, generator):
    """BUG: a law check without power (n // 300 samples): everything passes."""
    import solutions.ex10_beyond_one_chain as sol
    return sol.first_token_p_value(rule, p, q, max(n // 300, 5), generator)


def p_value_from_acceptance(rule, p, q, n, generator):
    """BUG: 'acceptance went up, so the rule is right': passes any rule that accepts at least as much as the standard."""
    k, V = q.shape
    drafts = torch.multinomial(q, n, replacement=True, generator=generator).T.reshape(-1)
    acc = lambda r: float(((r(drafts, [k] * n, p.repeat(n, 1), q.repeat(n, 1), generator=generator) >= 0).sum(1) - 1)  # noqa: E731
                          .double().mean())
    return 1.0 if acc(rule) >= acc(rejection.rejection_sample) - 0.05 else 0.0


def p_value_against_q(rule, p, q, n, generator):
    """BUG: tests the first tokens against the draft's first row q[0] instead of the target's p[0]."""
    from speclab.stats import chi2_gof
    k, V = q.shape
    drafts = torch.multinomial(q, n, replacement=True, generator=generator).T.reshape(-1)
    out = rule(drafts, [k] * n, p.repeat(n, 1), q.repeat(n, 1), generator=generator)
    return chi2_gof(np.bincount(out[:, 0].numpy(), minlength=V), q[0].numpy())


def p_value_accepted_only(rule, p, q, n, generator):
    """BUG: counts only the requests whose first draft was accepted."""
    from speclab.stats import chi2_gof
    k, V = q.shape
    drafts = torch.multinomial(q, n, replacement=True, generator=generator).T.reshape(-1)
    out = rule(drafts, [k] * n, p.repeat(n, 1), q.repeat(n, 1), generator=generator)
    first = out[:, 0][out[:, 0] == drafts.reshape(n, k)[:, 0]]
    return chi2_gof(np.bincount(first.numpy(), minlength=V), p[0].numpy())


def test_controls_law(controls):
    import solutions.ex10_beyond_one_chain as sol
    assert check_law(sol) is None
    caught(check_law, "a lossy rule labelled lossless", first_token_p_value=p_value_few_samples)
    caught(check_law, "a lossy rule labelled lossless", first_token_p_value=p_value_from_acceptance)
    caught(check_law, "an exact rule labelled lossy", first_token_p_value=p_value_against_q)
    caught(check_law, "an exact rule labelled lossy", first_token_p_value=p_value_accepted_only)
