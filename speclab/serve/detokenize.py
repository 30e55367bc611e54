"""Incremental detokenization with stop strings, for streaming.

Each engine step gives a request a few new tokens; the client wants the new *text*. Decoding the
whole output and sending what is new is simple and right at byte boundaries: a token that ends in
the middle of a UTF-8 character decodes to U+FFFD, so text is held back until the character is
complete. Text that could still be the start of a stop string is held back too (vLLM does the
same), and when a stop string appears the text ends before it (OpenAI's rule).
"""

from __future__ import annotations


class TextStream:
    """Args:
        tokenizer: a Hugging Face tokenizer.
        stop: stop strings (may be empty).
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.token_ids: list[int] = []
        self.text = ""  # the text sent so far
        self.stopped = False  # a stop string was found

    def push(self, token_ids: list[int], finished: bool) -> str:
        """Add tokens; return the text that can be sent now (all of it once finished or stopped)."""
        self.token_ids += token_ids
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        cut = min((i for i in (full.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            full, self.stopped, finished = full[:cut], True, True
        if not finished:
            if full.endswith("\ufffd"):
                full = full.rstrip("\ufffd")
            hold = max((len(s) - 1 for s in self.stop), default=0)
            full = full[:max(len(self.text), len(full) - hold)]
        if not full.startswith(self.text):  # a retokenization changed earlier text: send nothing wrong
            return ""
        delta, self.text = full[len(self.text):], full
        return delta
