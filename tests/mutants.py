"""Deliberately broken verifiers: the negative controls of the statistical tests.

Each has `speclab.verify.verify_step`'s signature and one classic bug. A statistical test
that passes the real verifier must also *fail* every mutant it is meant to catch; otherwise
the test has no power and proves nothing.
"""

import torch

from speclab.verify import draw_uniforms
from speclab.verify.tree import recursive_rejection_sample as _recursive_rejection_sample  # the real rule, kept


def _one_hot_rows(draft_tokens, p, q):
    if q is not None:
        return q
    q = torch.zeros(len(draft_tokens), p.shape[-1], dtype=p.dtype)
    q[torch.arange(len(draft_tokens)), torch.as_tensor(draft_tokens, dtype=torch.long)] = 1.0
    return q


def _verify(draft_tokens, p, q, *, uniforms=None, generator=None,
            residual_from_p=False, bonus_argmax=False, reuse_uniform=False, accept_if_p_ge_q=False):
    draft_tokens = [int(t) for t in draft_tokens]
    k = len(draft_tokens)
    q = _one_hot_rows(draft_tokens, p, q)
    u = draw_uniforms(k, generator, p.device) if uniforms is None else uniforms
    if reuse_uniform and k:
        u = u[:1].expand(k)  # BUG: one uniform for every position
    out = []
    for i, x in enumerate(draft_tokens):
        p_x, q_x = p[i, x].item(), q[i, x].item()
        ok = p_x >= q_x if accept_if_p_ge_q else (q_x > 0 and p_x / q_x >= u[i].item())  # BUG: no coin
        if ok:
            out.append(x)
            continue
        r = p[i] if residual_from_p else (p[i] - q[i]).clamp(min=0)  # BUG: residual from p
        if r.sum() <= 0:
            r = p[i]
        out.append(int(torch.multinomial(r / r.sum(), 1, generator=generator)))
        return out
    bonus = int(p[k].argmax()) if bonus_argmax else int(torch.multinomial(p[k], 1, generator=generator))
    out.append(bonus)  # BUG (bonus_argmax): the bonus token must be sampled from p, not its argmax
    return out


def residual_from_p(draft_tokens, p, q=None, *, uniforms=None, generator=None):
    """Draws the recovered token from p instead of norm(max(p - q, 0))."""
    return _verify(draft_tokens, p, q, uniforms=uniforms, generator=generator, residual_from_p=True)


def bonus_by_argmax(draft_tokens, p, q=None, *, uniforms=None, generator=None):
    """Takes the bonus token as argmax p_{k+1} instead of sampling it."""
    return _verify(draft_tokens, p, q, uniforms=uniforms, generator=generator, bonus_argmax=True)


def one_uniform_for_all(draft_tokens, p, q=None, *, uniforms=None, generator=None):
    """Reuses the first position's uniform for every position."""
    return _verify(draft_tokens, p, q, uniforms=uniforms, generator=generator, reuse_uniform=True)


def accept_if_p_ge_q(draft_tokens, p, q=None, *, uniforms=None, generator=None):
    """Accepts exactly when p(x) >= q(x), with no coin flip for p < q."""
    return _verify(draft_tokens, p, q, uniforms=uniforms, generator=generator, accept_if_p_ge_q=True)


MUTANTS = {
    "residual_from_p": residual_from_p,
    "bonus_by_argmax": bonus_by_argmax,
    "one_uniform_for_all": one_uniform_for_all,
    "accept_if_p_ge_q": accept_if_p_ge_q,
}


def sample_tree_without_removal(tree, tokens, probs, generator):
    """MUTANT of `speclab.verify.tree.sample_tree` (a tree walk, not a chain verifier): tests every sibling
    against the original p (no mass removed after a rejection)."""
    node, path = 0, []
    while True:
        p = probs[node].double()
        nxt = next((c for c in tree.children[node]
                    if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(p[tokens[c - 1]])), None)
        if nxt is None:
            return path, [tokens[c - 1] for c in path] + [int(torch.multinomial(p, 1, generator=generator))]
        path.append(nxt)
        node = nxt


def drawn_siblings_verified_as_iid(p, drafts, q, *, without_replacement, generator=None, uniforms=None, noise=None):
    """MUTANT of `speclab.verify.tree.recursive_rejection_sample` as `sample_tree_drawn` calls it: siblings drawn
    without replacement are tested against the original q every time (SpecInfer's update for i.i.d. siblings)."""
    return _recursive_rejection_sample(p, drafts, q, without_replacement=False, generator=generator,
                                       uniforms=uniforms, noise=noise)


def on_support_forgetting_the_rest(p, drafts, q, generator):
    """MUTANT of `speclab.verify.tree._on_support`: recursive rejection sampling over q's support only, as if
    the target could say nothing the draft vocabulary lacks (p restricted there and renormalised)."""
    support = torch.unique(torch.cat([q.nonzero().flatten(), torch.tensor(drafts)]))
    index = {int(t): j for j, t in enumerate(support.tolist())}
    p_s = p.double()[support]
    i, y = _recursive_rejection_sample(p_s / p_s.sum(), [index[d] for d in drafts], q[support].double(),
                                       without_replacement=True, generator=generator)
    return i, int(support[y])


def q_without_temperature(logits, temperature=1.0, top_k=0, top_p=1.0):
    """A drafter's q that skips the request's temperature (as if T were 1): children drawn from it follow
    the wrong law (`speclab.proposers.tree_drafting.logits_to_probs`'s stand-in in the draw test)."""
    from speclab.sampling import logits_to_probs
    return logits_to_probs(logits, 1.0, top_k, top_p)
