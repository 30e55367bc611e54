"""`speculative_config`: the same JSON keys as vLLM's --speculative-config, and vLLM's checks.

    LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                            "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    LLM(speculative_config={"method": "draft_model", "model": "draft", "num_speculative_tokens": 4})
    LLM(speculative_config={"method": "eagle", "model": "eagle", "num_speculative_tokens": 4})
    LLM("smollm2", speculative_config={"method": "eagle", "model": "eagle-smollm2", "num_speculative_tokens": 4})

Head methods ("eagle", "eagle3", "mtp", "medusa"; lesson 08) take a head directory or the name of a
shipped head as `model`; without one, speclab picks the head it ships for the target (vLLM does that
for mtp only, whose weights live in the target's checkpoint).

    LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                            "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 32, 2], [33, 1024, 0]]})
    LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4, "adaptive": True})  # speclab's

Dynamic speculation (lesson 09): vLLM's `num_speculative_tokens_per_batch_size` maps inclusive
batch-size ranges to k (0: off), as a list of [start, end, k] (vLLM's form, from v0.24.0) or, in speclab
only, a JSON object {"1-8": 4, ...} (vLLM 0.32 refuses it: "Input should be a valid list"); it
replaced `disable_by_batch_size`, which did nothing in vLLM v1 and was removed (PR #35060), so that key
is refused with the replacement. `adaptive` (speclab's own key) picks k each step from live measurements.
"""

import dataclasses
import re
import warnings
from dataclasses import dataclass, fields

from speclab.engine.proposer import SAMPLE_METHODS as DRAFT_SAMPLE_METHODS
from speclab.engine.spec_policy import AdaptivePolicy, BatchSizeSchedule, SpecPolicy
from speclab.models.heads import head_method
from speclab.proposers import GRAFT_METHODS
from speclab.proposers import METHODS as PROPOSERS
from speclab.proposers import suffix
from speclab.verify import LOSSY_RULES, get_rule
from speclab.verify.tree import parse_tree

METHODS = tuple(PROPOSERS)  # the registry's names (speclab.proposers.METHODS)
NOT_YET = ("mlp_speculator", "ngram_gpu", "dflash")  # vLLM methods speclab does not build
TREE_METHODS = ("eagle", "eagle3", "draft_model")  # drafters that grow trees (lesson 10)
DRAFT_DTYPES = ("float32", "bfloat16")  # a drafter's dtypes apart from the target's (speclab's few-row kernel has both)


@dataclass
class SpeculativeConfig:
    """Attributes (vLLM's names):
        method: "ngram", "draft_model", or a head method "eagle", "eagle3", "mtp", "medusa"
            (inferred from `model` when missing, as vLLM does).
        num_speculative_tokens: k > 0, drafts per step.
        model: the draft model (draft_model): a directory, a hub id, or "draft" (the embedded draft);
            a head (head methods): its directory or a shipped head's name (None: the target's own).
        prompt_lookup_max, prompt_lookup_min: n-gram sizes (ngram); one set copies to the other.
        draft_sample_method: "greedy" (argmax drafts, q treated as one-hot, vLLM's default) or
            "probabilistic" (drafts sampled from q, q kept for verification: higher acceptance at T > 0;
            with a static speculative_token_tree, speclab's: each node's children drawn from q without
            replacement and verified by recursive rejection sampling, lesson 10).
        draft_vocab_size: speclab's key (draft_model only): the draft scores only the target's
            draft_vocab_size most frequent tokens, from the ranking shipped beside the draft (FR-Spec;
            speclab.models.draft_vocab): a cheaper draft, still exact. None: the whole vocabulary.
            (A head declares its own in its config.json, as EAGLE-3's do in vLLM.)
        draft_dtype: speclab's key (draft_model and the head methods): the drafter's weights, cache and
            arithmetic in "bfloat16" or "float32" whatever the target's dtype (None: the target's, as in
            vLLM, where a draft follows the target). Drafts only propose, so a bfloat16 drafter beside a
            float32 target reads half the bytes per drafted token and the output stays exactly the
            target's; only the acceptance can move (lesson 04).
        num_speculative_tokens_per_batch_size: vLLM's dynamic k: [[start, end, k], ...] (or speclab's {"start-end": k}),
            inclusive ranges, 0 = off; normalized to a sorted list of (start, end, k).
        adaptive: speclab's adaptive k (0..num_speculative_tokens) from live acceptance and costs.
        rejection_sample_method: the verification rule, vLLM's key: "standard" (the default), "block"
            (block verification), or "typical" (LOSSY typical acceptance: only when named); speclab.verify.RULES.
        suffix_decoding_max_tree_depth, suffix_decoding_max_cached_requests, suffix_decoding_max_spec_factor,
        suffix_decoding_min_token_prob: suffix decoding's knobs (method "suffix"; vLLM's names and defaults:
            24, 10000, 1.0, 0.1; see speclab.proposers.suffix).
        speculative_token_tree: vLLM's static draft tree (lesson 10), a string of paths of child ranks,
            "[(0,), (1,), (0, 0)]"; num_speculative_tokens is then its node count (eagle, eagle3, draft_model).
        speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens: an EAGLE-2 dynamic
            tree, SGLang's knobs (depth, branching, verified tokens including the root: all three, and
            num_speculative_tokens = speculative_num_draft_tokens - 1). Trees verify exactly with
            recursive rejection sampling (speclab.verify.tree), so they need the "standard" rule.
        graft_method: speclab's key: "ngram" or "suffix" grafts that lookup's draft into the tree as one
            more branch (speclab.proposers.graft); num_speculative_tokens is then the verified budget, the
            tree's nodes plus the lookup's tokens, and the lookup's own keys (prompt_lookup_*,
            suffix_decoding_*) apply to it. None: the tree alone.
    """

    method: str | None = None
    num_speculative_tokens: int | None = None
    model: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    draft_sample_method: str = "greedy"
    draft_vocab_size: int | None = None
    draft_dtype: str | None = None
    num_speculative_tokens_per_batch_size: dict | list | None = None
    adaptive: bool = False
    rejection_sample_method: str = "standard"
    suffix_decoding_max_tree_depth: int = suffix.MAX_TREE_DEPTH
    suffix_decoding_max_cached_requests: int = suffix.MAX_CACHED_REQUESTS
    suffix_decoding_max_spec_factor: float = suffix.MAX_SPEC_FACTOR
    suffix_decoding_min_token_prob: float = suffix.MIN_TOKEN_PROB
    speculative_token_tree: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    graft_method: str | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "SpeculativeConfig":
        if not isinstance(d, dict):
            raise TypeError(f"speculative_config must be a dict of vLLM's keys, got {type(d).__name__}")
        valid = [f.name for f in fields(cls)]
        if "disable_by_batch_size" in d:
            raise ValueError("'disable_by_batch_size' did nothing in vLLM v1 and was removed (PR #35060): use "
                             "'num_speculative_tokens_per_batch_size', e.g. [[1, 16, 4], [17, 4096, 0]] to stop "
                             "speculating above batch 16, or speclab's 'adaptive': true")
        if "tensor_parallel_size" in d:
            raise ValueError("'tensor_parallel_size' is not a valid argument in the speculative_config "
                             "(vLLM takes 'draft_tensor_parallel_size'; speclab runs on one device)")
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"unknown speculative_config key(s) {unknown}: valid keys are {valid}")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.method is None:  # vLLM infers it from the model
            if self.model in ("ngram", "[ngram]"):
                self.method, self.model = "ngram", None
            elif self.model is not None:
                self.method = head_method(self.model) or "draft_model"
            else:
                raise ValueError("speculative_config needs 'method' (one of ngram, draft_model) or a draft 'model'")
        if self.method in NOT_YET:
            raise NotImplementedError(f"speculative method {self.method!r} is not implemented in speclab yet: "
                                      f"use one of {METHODS}")
        if self.method not in METHODS:
            raise NotImplementedError(f"Unsupported speculative method: {self.method!r} (choose one of {METHODS})")
        if self.num_speculative_tokens is None:
            raise ValueError("num_speculative_tokens must be provided (the number of drafts per step, e.g. 4)")
        if isinstance(self.num_speculative_tokens, bool) or not isinstance(self.num_speculative_tokens, int) \
                or self.num_speculative_tokens <= 0:
            raise ValueError(f"Expected num_speculative_tokens to be greater than zero ({self.num_speculative_tokens})")
        get_rule(self.rejection_sample_method)  # a clear error for an unknown rule
        if self.rejection_sample_method in LOSSY_RULES:
            warnings.warn(f"rejection_sample_method {self.rejection_sample_method!r} is LOSSY: at temperature > 0 the "
                          f"output no longer follows the target's distribution (lesson 10 measures the distance); "
                          f"use 'standard' or 'block' for exact speculative decoding", stacklevel=3)
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise ValueError(f"draft_sample_method must be one of {DRAFT_SAMPLE_METHODS}, got {self.draft_sample_method!r}")
        self._validate_dynamic()
        self._validate_tree()
        self._validate_graft()
        self._validate_draft_vocab()
        self._validate_draft_dtype()
        if self.method == "ngram":
            self._validate_ngram()
        elif self.method == "suffix":
            self._validate_suffix()
        elif self.method == "draft_model" and self.model is None:
            raise ValueError("method 'draft_model' needs a draft 'model' (a directory, a hub id, or 'draft' for "
                             "the embedded draft)")
        elif self.method == "draft_model" and (head := head_method(self.model)) is not None:
            raise ValueError(f"{self.model!r} is a head, not a draft model: use method {head!r}")

    def _validate_tree(self) -> None:
        dynamic = {"speculative_num_steps": self.speculative_num_steps, "speculative_eagle_topk":
                   self.speculative_eagle_topk, "speculative_num_draft_tokens": self.speculative_num_draft_tokens}
        given = [key for key, v in dynamic.items() if v is not None]
        if self.speculative_token_tree is None and not given:
            return
        if self.method not in TREE_METHODS:
            raise ValueError(f"draft trees are built by the model drafters {TREE_METHODS}, not by {self.method!r}")
        if self.speculative_token_tree is not None and given:
            raise ValueError(f"give a static 'speculative_token_tree' or the dynamic tree's {sorted(dynamic)}, not both")
        if self.rejection_sample_method != "standard":
            raise ValueError(f"a tree verifies with recursive rejection sampling (exact): rejection_sample_method must "
                             f"be 'standard', got {self.rejection_sample_method!r}")
        if self.speculative_token_tree is not None:
            n = parse_tree(self.speculative_token_tree).num_nodes  # a clear error for what is not a tree
            if n != self.num_speculative_tokens and self.graft_method is None:
                raise ValueError(f"speculative_token_tree has {n} nodes and num_speculative_tokens is "
                                 f"{self.num_speculative_tokens}: they must be equal (vLLM's rule; set "
                                 f"num_speculative_tokens to {n})")
        else:
            if len(given) != 3:
                raise ValueError(f"a dynamic tree needs all three of {sorted(dynamic)} (SGLang's rule), got {given}")
            for key, v in dynamic.items():
                if isinstance(v, bool) or not isinstance(v, int) or v < (2 if key == "speculative_num_draft_tokens" else 1):
                    raise ValueError(f"{key} must be an integer >= {2 if key == 'speculative_num_draft_tokens' else 1}, "
                                     f"got {v!r}")
            if self.speculative_num_draft_tokens - 1 != self.num_speculative_tokens and self.graft_method is None:
                raise ValueError(f"speculative_num_draft_tokens={self.speculative_num_draft_tokens} counts the root: "
                                 f"num_speculative_tokens must be {self.speculative_num_draft_tokens - 1}")
        if self.draft_sample_method != "greedy" and (self.speculative_token_tree is None or self.graft_method):
            raise ValueError("a dynamic tree's children, and a graft's tree's, are the drafter's top-k: "
                             "draft_sample_method must be 'greedy' there (a static speculative_token_tree alone may "
                             "draw its children with 'probabilistic'; verification samples exactly either way)")

    @property
    def tree_nodes(self) -> int | None:
        """The draft tree's nodes (static or dynamic), None for a chain."""
        if self.speculative_token_tree is not None:
            return parse_tree(self.speculative_token_tree).num_nodes
        return None if self.speculative_num_draft_tokens is None else self.speculative_num_draft_tokens - 1

    def grafted_parts(self) -> tuple["SpeculativeConfig", "SpeculativeConfig"]:
        """With graft_method: (the drafter's config, k = its tree's nodes; the lookup's, k = the rest of the
        budget and its own keys), each checked."""
        nodes = self.tree_nodes
        alone = dict(graft_method=None, adaptive=False, num_speculative_tokens_per_batch_size=None)  # the policy is the whole's
        drafter = dataclasses.replace(self, num_speculative_tokens=nodes, **alone)
        lookup = dataclasses.replace(
            self, method=self.graft_method, num_speculative_tokens=self.num_speculative_tokens - nodes, model=None,
            draft_dtype=None, draft_vocab_size=None, speculative_token_tree=None, speculative_num_steps=None,
            speculative_eagle_topk=None, speculative_num_draft_tokens=None, **alone)
        drafter.validate()
        lookup.validate()
        return drafter, lookup

    def _validate_graft(self) -> None:
        if self.graft_method is None:
            return
        if self.graft_method not in GRAFT_METHODS:
            raise ValueError(f"graft_method must be one of {GRAFT_METHODS} (a lookup whose draft joins the tree), "
                             f"got {self.graft_method!r}")
        nodes = self.tree_nodes
        if nodes is None:
            raise ValueError(f"graft_method adds the lookup's draft to a model drafter's tree: give "
                             f"'speculative_token_tree' (a chain of 3 is \"[(0,), (0, 0), (0, 0, 0)]\") or the "
                             f"dynamic tree's keys, with a method in {TREE_METHODS}")
        if self.num_speculative_tokens <= nodes:
            raise ValueError(f"with graft_method, num_speculative_tokens is the verified budget: the tree's {nodes} "
                             f"nodes plus the lookup's tokens; set it above {nodes} (e.g. {nodes + 3} grafts up to 3)")
        self.grafted_parts()  # the lookup's keys, checked as its method checks them

    def _validate_draft_vocab(self) -> None:
        v = self.draft_vocab_size
        if v is None:
            return
        if self.method != "draft_model":
            raise ValueError(f"draft_vocab_size is a draft model's key (method 'draft_model'), not {self.method!r}'s: "
                             f"a head declares its reduced vocabulary in its own config.json")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"draft_vocab_size must be a positive integer (tokens the draft scores), got {v!r}")

    def _validate_draft_dtype(self) -> None:
        if self.draft_dtype is None:
            return
        if self.method in ("ngram", "suffix"):
            raise ValueError(f"draft_dtype sets a model drafter's weights (draft_model and the head methods); "
                             f"method {self.method!r} drafts from token statistics and has none")
        if self.draft_dtype not in DRAFT_DTYPES:
            raise ValueError(f"draft_dtype must be one of {DRAFT_DTYPES} (or None: the target's dtype), got "
                             f"{self.draft_dtype!r}")

    def _validate_suffix(self) -> None:
        if self.model is not None:
            raise ValueError("method 'suffix' takes no 'model': drafts come from suffix trees over the context and "
                             "earlier outputs")
        suffix.check_knobs(self.num_speculative_tokens, self.suffix_decoding_max_tree_depth,
                           self.suffix_decoding_max_cached_requests, self.suffix_decoding_max_spec_factor,
                           self.suffix_decoding_min_token_prob)

    def _validate_ngram(self) -> None:
        if self.model is not None:
            raise ValueError("method 'ngram' takes no 'model': drafts come from the context itself")
        if self.prompt_lookup_max is None and self.prompt_lookup_min is None:
            self.prompt_lookup_max = self.prompt_lookup_min = 5  # vLLM's default when both are unset
        if self.prompt_lookup_max is None:  # vLLM: one given, the other copies it
            self.prompt_lookup_max = self.prompt_lookup_min
        if self.prompt_lookup_min is None:
            self.prompt_lookup_min = self.prompt_lookup_max
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if isinstance(getattr(self, key), bool) or not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {getattr(self, key)!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} must be <= "
                             f"prompt_lookup_max={self.prompt_lookup_max}")

    def _validate_dynamic(self) -> None:
        table = self.num_speculative_tokens_per_batch_size
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be true or false, got {self.adaptive!r}")
        if table is None:
            return
        if self.adaptive:
            raise ValueError("give either 'num_speculative_tokens_per_batch_size' (a fixed table) or 'adaptive': "
                             "true (k chosen from live measurements), not both")
        self.num_speculative_tokens_per_batch_size = parse_batch_size_table(table, self.num_speculative_tokens)

    def make_policy(self) -> SpecPolicy | None:
        """The engine's per-step k policy, or None for a fixed k."""
        if self.adaptive:
            return AdaptivePolicy(self.num_speculative_tokens)
        if self.num_speculative_tokens_per_batch_size is not None:
            return BatchSizeSchedule(self.num_speculative_tokens, self.num_speculative_tokens_per_batch_size)
        return None


def parse_batch_size_table(table, k_max: int) -> list[tuple[int, int, int]]:
    """[[1, 16, 3], [17, 64, 0]] (vLLM's form) or {"1-16": 3, "17-64": 0} -> [(1, 16, 3), (17, 64, 0)], checked as vLLM
    checks it: the first range starts at 1, ranges do not overlap, and a k above k_max is clamped to k_max."""
    fix = ('num_speculative_tokens_per_batch_size maps inclusive batch-size ranges to k, as vLLM takes it: a list '
           '[[1, 16, 4], [17, 64, 2], [65, 4096, 0]] (speclab also reads {"1-16": 4, "17-64": 2, "65-4096": 0}, '
           'which vLLM refuses)')
    if isinstance(table, dict):
        rows = []
        for key, k in table.items():
            m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", str(key))
            if not m:
                raise ValueError(f"range {key!r} is not 'start-end': {fix}")
            rows.append((int(m.group(1)), int(m.group(2)), k))
    elif isinstance(table, (list, tuple)):
        if not all(isinstance(r, (list, tuple)) and len(r) == 3 for r in table):
            raise ValueError(f"every entry must be [start, end, k], got {table!r}: {fix}")
        rows = [tuple(r) for r in table]
    else:
        raise ValueError(f"got {type(table).__name__}: {fix}")
    if not rows:
        raise ValueError(f"the table is empty: {fix}")
    for start, end, k in rows:
        if any(isinstance(x, bool) or not isinstance(x, int) for x in (start, end, k)):
            raise ValueError(f"range {start}-{end} -> {k!r}: bounds and k must be integers; {fix}")
        if not 1 <= start <= end:
            raise ValueError(f"range {start}-{end}: need 1 <= start <= end; {fix}")
        if k < 0:
            raise ValueError(f"range {start}-{end} -> k={k}: k must be >= 0 (0 turns speculation off); {fix}")
    rows.sort()
    if rows[0][0] != 1:
        raise ValueError(f"the first range starts at {rows[0][0]}: vLLM requires the table to start at batch "
                         f"size 1 (write {{\"1-{rows[0][1]}\": {rows[0][2]}, ...}}); {fix}")
    for (s0, e0, _), (s1, e1, _) in zip(rows, rows[1:]):
        if s1 <= e0:
            raise ValueError(f"ranges {s0}-{e0} and {s1}-{e1} overlap: each batch size must have one k")
    # As vLLM does, a k above num_speculative_tokens (the maximum, whose slots are allocated) is clamped to it.
    return [(start, end, min(k, k_max)) for start, end, k in rows]
