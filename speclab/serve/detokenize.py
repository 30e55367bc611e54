"""Incremental detokenization with stop strings, for streaming (vLLM's output processor in miniature).

Each engine step gives a request a few new tokens; the client wants the new *text*. Decoding the
whole output and sending what is new is simple and right at byte boundaries: a token that ends in
the middle of a UTF-8 character decodes to U+FFFD, so text is held back until the character is
complete. Text that could still be the start of a stop string is held back too (vLLM does the
same), and when a stop string appears the text ends before it (OpenAI's rule).

A step can bring several tokens (accepted drafts). When a stop string appears among them, only the
tokens up to the one that completed it are kept: those are what the client is told it got (usage)
and what the metrics count; the tokens after it were never part of the answer.
"""

from __future__ import annotations


class TextStream:
    """Args:
        tokenizer: a Hugging Face tokenizer.
        stop: stop strings (may be empty).
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.token_ids: list[int] = []
        self.text = ""  # the text sent so far
        self.stopped = False  # a stop string was found

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _stop_at(self, full: str) -> int:
        """Where the earliest stop string starts in `full` (-1: none)."""
        return min((i for i in (full.find(s) for s in self.stop) if i >= 0), default=-1)

    def push(self, token_ids: list[int], finished: bool) -> tuple[list[int], str]:
        """Add one step's tokens.

        Returns:
            (kept, text): the tokens that belong to the answer (all of them, unless a stop string ends
            the text within them: then up to the one that completed it) and the text that can be sent
            now (all of it once finished or stopped).
        """
        base = len(self.token_ids)
        self.token_ids += token_ids
        full = self._decode(self.token_ids)
        cut = self._stop_at(full) if self.stop and token_ids else -1
        kept = list(token_ids)
        if cut >= 0:
            n = next(n for n in range(1, len(token_ids) + 1)
                     if n == len(token_ids) or self._stop_at(self._decode(self.token_ids[:base + n])) >= 0)
            kept, self.token_ids = kept[:n], self.token_ids[:base + n]
            full, self.stopped, finished = full[:cut], True, True
        if not finished:
            if full.endswith("\ufffd"):
                full = full.rstrip("\ufffd")
            hold = max((len(s) - 1 for s in self.stop), default=0)
            full = full[:max(len(self.text), len(full) - hold)]
        if not full.startswith(self.text):  # a retokenization changed earlier text: send nothing wrong
            return kept, ""
        delta, self.text = full[len(self.text):], full
        return kept, delta
