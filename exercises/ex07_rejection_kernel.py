"""Exercise 07: the accept walk of the Triton verifier, on vLLM's inclusive offsets.

`accept_kernel` does the job of kernel 2 of speclab/kernels/rejection_sample.py, but takes the
batch as vLLM's rejection sampler does: `cu_num_draft_tokens` is the *inclusive* cumulative sum of
the drafts per request (no leading 0, no separate k). Request r's drafts are rows
[cu[r - 1], cu[r]) (cu[-1] taken as 0) and its target rows start at cu[r - 1] + r. One program per
request accepts x_i iff
  x_i >= 0 (a -1 placeholder is always rejected), q_i(x_i) > 0, and
  p_i(x_i) / q_i(x_i) >= u_i  (divided in p's precision with IEEE rounding, compared in float64),
with q_i(x_i) = 1 when NO_DRAFT_PROBS (one-hot drafts). It writes each accepted draft at
out[r, i], stops at the first rejection and stores the number accepted n at num_accepted[r].
Greedy requests (is_greedy[r]) are not its business: it returns at once for them.

Graded by: .venv/bin/python -m pytest --impl=exercises tests/test_ex07_rejection_kernel.py
"""

import triton
import triton.language as tl


@triton.jit
def accept_kernel(out_ptr, stride_out, num_accepted_ptr, draft_ptr, cu_num_draft_ptr, is_greedy_ptr,
                  target_ptr, stride_target, stride_target_v,
                  draft_probs_ptr, stride_draft, stride_draft_v, uniforms_ptr,
                  NO_DRAFT_PROBS: tl.constexpr):
    """Walk request r = program_id(0)'s drafts; store accepted drafts and their count n."""
    # About 22 lines. Lesson 07's accept_walk (in Python) and speclab's _accept_kernel read an
    # exclusive cu and a k per request; here you only get vLLM's inclusive cu_num_draft_tokens.
    # Return at once for a greedy request; find request r's first draft row and k_r (careful at r = 0:
    # a masked load, tl.load(ptr, mask=..., other=0)); loop i over the drafts while nothing was
    # rejected: load x_i, then p(x_i) and q(x_i) with the loads masked when x_i == -1 (q = 1 when
    # NO_DRAFT_PROBS) and u_i; accept as the docstring at the top says (tl.math.div_rn(p, q), IEEE
    # division, compare in tl.float64); store accepted drafts at out[r, i]; finally store n at num_accepted[r].
    raise NotImplementedError("TODO(ex07): derive r's draft rows from the inclusive cu_num_draft_tokens, then walk "
                              "them: accept while x >= 0, q > 0 and p / q >= u; store the drafts and n (~22 lines)")
