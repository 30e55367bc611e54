"""Which implementation of a verification rule runs: the torch reference or the Triton kernel (lesson 07).

A rule (`speclab.verify.RULES`, keyed by vLLM's `rejection_sample_method`) has one torch reference;
a kernel module may implement some rules too (`speclab.kernels.rejection_sample.RULES`). Given the
same uniforms and noise, both return the same tokens. The engine asks `get_rejection_sampler()`
once and calls the result.

    SPECLAB_VERIFIER=auto    Triton for probabilities on a CUDA GPU when triton imports and
                             implements the rule, torch otherwise (default). speclab's engine runs
                             on the CPU, so on a machine with a GPU its CPU tensors still take
                             the torch reference: the choice is made per call, by the tensors' device
    SPECLAB_VERIFIER=torch   the torch reference, speclab.verify.RULES[method]
    SPECLAB_VERIFIER=triton  the kernel; without a GPU only under Triton's interpreter
                             (TRITON_INTERPRET=1, slow: for tests)
"""

import functools
import os

import torch

from speclab.verify import get_rule

BACKENDS = ("auto", "torch", "triton")


def get_rejection_sampler(backend: str | None = None, method: str = "standard"):
    """Return the implementation of rule `method` to use.

    Args:
        backend: "auto", "torch" or "triton"; None reads the SPECLAB_VERIFIER environment
            variable (default "auto").
        method: a `rejection_sample_method` name ("standard", ...).
    Returns:
        A function with the signature and outputs of `speclab.verify.rejection_sample` (no `method`).
    """
    name = backend if backend is not None else os.environ.get("SPECLAB_VERIFIER", "auto")
    name = name.strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown verifier backend {name!r}: choose one of {', '.join(BACKENDS)} "
                         f"(argument `backend` or the SPECLAB_VERIFIER environment variable)")
    reference = get_rule(method)
    if name == "torch" or (name == "auto" and not torch.cuda.is_available()):
        return reference
    kernels = _kernels(name)
    if kernels is None or (name == "auto" and method not in kernels.RULES):
        return reference
    if name == "auto":
        return _by_device(kernels.RULES[method], reference)
    if method not in kernels.RULES:
        raise RuntimeError(f"SPECLAB_VERIFIER=triton but the Triton kernels implement {sorted(kernels.RULES)}, "
                           f"not rejection_sample_method {method!r}: use SPECLAB_VERIFIER=torch")
    if not torch.cuda.is_available() and not kernels.interpreted():
        raise RuntimeError("SPECLAB_VERIFIER=triton needs a CUDA GPU. Without one, set TRITON_INTERPRET=1 "
                           "before starting Python to run the kernels in Triton's CPU interpreter (slow), "
                           "or use SPECLAB_VERIFIER=torch")
    return kernels.RULES[method]


def _by_device(kernel, reference):
    """`auto` on a CUDA machine: the kernel for CUDA tensors, the reference for CPU ones (the compiled
    kernels cannot read host memory). The two return the same tokens, so the choice is invisible."""
    @functools.wraps(kernel)
    def verify(draft_token_ids, num_draft_tokens, target_probs, *args, **kwargs):
        fn = kernel if torch.is_tensor(target_probs) and target_probs.is_cuda else reference
        return fn(draft_token_ids, num_draft_tokens, target_probs, *args, **kwargs)
    verify.kernel, verify.reference = kernel, reference
    return verify


def _kernels(name: str):
    """The Triton kernel module, or None when it does not import and `auto` may fall back."""
    try:
        from speclab.kernels import rejection_sample as kernels
    except ImportError as err:
        if name == "auto":
            return None
        raise RuntimeError(f"SPECLAB_VERIFIER=triton but the Triton kernels do not import ({err}): "
                           f"install triton (pip install -e .), or use SPECLAB_VERIFIER=torch") from err
    return kernels
