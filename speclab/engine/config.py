"""EngineConfig: every knob of the engine in one dataclass, checked together (as vLLM checks them).

    EngineConfig(num_kv_blocks=256, block_size=16, max_num_batched_tokens=512, max_num_seqs=8,
                 num_speculative_tokens=4)

The checks that involve two knobs live here, not scattered through the engine: a step's token
budget must hold one token of every running request (`max_num_batched_tokens >= max_num_seqs`)
and one whole speculative step (`>= 1 + num_speculative_tokens`), and a block must hold a token.

k has one owner, the speculative config (`speculative_config["num_speculative_tokens"]`): `LLM`
copies it here and into the proposer it builds, and `LLMEngine` refuses a config and a proposer that
disagree, naming both.
"""

import numbers
from dataclasses import dataclass

VERIFIERS = ("auto", "torch", "triton")


def check_int(name: str, value, minimum: int) -> None:
    """A real integer (not a bool, not a float that happens to be whole) >= minimum, or a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass
class EngineConfig:
    """Attributes:
        num_kv_blocks: blocks in the target's paged KV pool.
        block_size: token slots per block.
        max_num_batched_tokens: token budget of one forward (prefill chunks + decodes + drafts).
        max_num_seqs: requests running at once.
        seed: the random stream of requests that have no seed of their own.
        verifier: "torch", "triton" or "auto"; None reads SPECLAB_VERIFIER (see speclab.backend).
        num_speculative_tokens: k, the most drafts per request and step (0: no speculation), derived
            from the speculative config; must equal the proposer's.
        rejection_sample_method: the verification rule (a name in speclab.verify.RULES), from the
            speculative config's key of the same name.
        num_lookahead_tokens: extra slots a decoding request reserves each step for a drafter that
            writes into the target's block tables after the target forward (EAGLE/MTP heads, lesson 08).
        enable_prefix_caching: share the KV blocks of a prompt prefix another request computed
            (vLLM's automatic prefix caching; speclab.kv_cache). Off by default, unlike vLLM, so each
            request's blocks are its own in the lessons; not with a drafter that writes into the
            target's block tables (its KV at a block's last slot depends on the next token).
    """

    num_kv_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    seed: int = 0
    verifier: str | None = None
    num_speculative_tokens: int = 0
    num_lookahead_tokens: int = 0
    rejection_sample_method: str = "standard"
    enable_prefix_caching: bool = False

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        check_int("num_kv_blocks", self.num_kv_blocks, 1)
        check_int("block_size", self.block_size, 1)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        check_int("max_num_seqs", self.max_num_seqs, 1)
        check_int("seed", self.seed, 0)
        check_int("num_speculative_tokens", self.num_speculative_tokens, 0)
        check_int("num_lookahead_tokens", self.num_lookahead_tokens, 0)
        if not isinstance(self.enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}")
        if self.enable_prefix_caching and self.num_lookahead_tokens:
            raise ValueError("enable_prefix_caching=True with a drafter that writes into the target's block tables "
                             "(EAGLE/MTP/Medusa heads: num_lookahead_tokens > 0) is not supported: a head's key and "
                             "value at a block's last slot depend on the token after the block, which another "
                             "request sharing the block may not have. Use enable_prefix_caching=False with a head, "
                             "or a proposer of its own cache (ngram, suffix, draft_model)")
        if self.verifier is not None and self.verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {VERIFIERS} or None, got {self.verifier!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({self.max_num_seqs}): every running request needs at least one token of each "
                             f"step's budget; raise max_num_batched_tokens or lower max_num_seqs")
        if self.max_num_batched_tokens < 1 + self.num_speculative_tokens:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= 1 + "
                             f"num_speculative_tokens ({1 + self.num_speculative_tokens}): one request's "
                             f"speculative step (its new token and its k drafts) must fit in one forward")
