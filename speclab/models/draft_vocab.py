"""A reduced draft vocabulary: the draft's LM head over the target's most frequent tokens only.

Zhao et al., "FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked
Speculative Sampling" (2025); EAGLE-3's `d2t` is the same idea for a head. A small draft of a
large-vocabulary target spends most of its time in its LM head: SmolLM2's 4-layer draft reads
57 MB of decoder layers and 113 MB of LM head (49152 x 576, float32) per drafted token. Scoring only
the V_draft tokens the target writes most often shrinks that matmul by V / V_draft, and the drafts
lose little: a token outside the set is rarely what the target would say.

It stays exact. The draft's distribution q is the softmax over the kept tokens (q = 0 elsewhere),
the drafts are drawn from that q (or are its argmax), and that same q goes to the verifier: the
rejection rule is exact for any q (lesson 01), so the output still follows the target. What a
token outside the set costs is acceptance, never correctness.

Which tokens: a ranking of the whole vocabulary, most frequent first, shipped beside the draft as
`token_ranking.json` ({"ranking": [token ids]}; not a .safetensors file, which weight loaders,
speclab's, transformers' and vLLM's, would take for a weight); `speclab.train.draft_vocab` builds
it from the target's own distribution over its training conversations. The first V_draft are kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from speclab.models.packed_linear import PackedLinear

RANKING_FILE = "token_ranking.json"


def scatter_to_vocab(sub: torch.Tensor, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(N, V_draft) logits over the kept tokens d2t -> (N, V) with -inf for every other token."""
    out = sub.new_full((sub.shape[0], vocab_size), float("-inf"))
    return out.index_copy_(1, d2t, sub)


def load_ranking(directory: str | Path, vocab_size: int) -> torch.Tensor:
    """The ranking shipped in `directory`: (V,) int64 token ids, most frequent first.

    Raises FileNotFoundError naming the command that builds one, ValueError when it is not a
    permutation of the vocabulary."""
    path = Path(directory) / RANKING_FILE
    if not path.is_file():
        raise FileNotFoundError(f"draft_vocab_size needs a token ranking beside the draft ({path} is missing): build "
                                f"it with `python -m speclab.train.draft_vocab --out {directory}`, or drop "
                                f"draft_vocab_size to draft over the whole vocabulary")
    try:
        ranking = torch.tensor(json.loads(path.read_text())["ranking"], dtype=torch.long)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a token ranking ({err}): rebuild it with "
                         f"`python -m speclab.train.draft_vocab`") from err
    if ranking.shape != (vocab_size,) or not torch.equal(ranking.sort().values, torch.arange(vocab_size)):
        raise ValueError(f"{path}: 'ranking' must be a permutation of the draft's {vocab_size} token ids, got shape "
                         f"{tuple(ranking.shape)}: rebuild it with `python -m speclab.train.draft_vocab`")
    return ranking


def kept_tokens(ranking: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """d2t: the first draft_vocab_size tokens of the ranking, sorted by id: (V_draft,) int64."""
    if isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int) \
            or not 1 <= draft_vocab_size <= ranking.numel():
        raise ValueError(f"draft_vocab_size must be an integer in 1..{ranking.numel()} (the vocabulary), "
                         f"got {draft_vocab_size!r}")
    return ranking[:draft_vocab_size].sort().values


class ReducedLMHead:
    """A draft model's LM head over d2t only.

    Args:
        lm_head_weight: (V, d) the draft's LM head (tied or not); its rows d2t are copied once
            (V_draft x d: 19 MB for SmolLM2 at 8192 tokens) and multiplied as the full head is
            (`PackedLinear`: the few-row kernel for a decode step's rows).
        d2t: (V_draft,) the kept token ids, sorted.
        dtype: the copy's dtype (default: the weight's), e.g. bfloat16 for a bfloat16 EAGLE head
            drafting through a float32 target's LM head.
    """

    def __init__(self, lm_head_weight: torch.Tensor, d2t: torch.Tensor, dtype: torch.dtype | None = None):
        self.vocab_size = lm_head_weight.shape[0]
        self.d2t = d2t.to(lm_head_weight.device)
        with torch.inference_mode(False):  # an ordinary tensor in any mode: PackedLinear tracks its version
            rows = lm_head_weight.detach().index_select(0, self.d2t)
            self.head = PackedLinear(rows.to(dtype or rows.dtype).contiguous())

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, d) hidden states after the draft's final norm -> (M, V) float32 logits, -inf outside d2t."""
        return scatter_to_vocab(self.head(hidden).float(), self.d2t, self.vocab_size)
