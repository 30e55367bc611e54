"""The OpenAI-compatible request and response shapes, and their translation into SamplingParams.

Shaped like vLLM's `vllm/entrypoints/openai/protocol.py`: the OpenAI fields a small server needs,
vLLM's sampling extras (`top_k`, `ignore_eos`, `min_tokens` ... as far as speclab's sampler has them),
unknown fields accepted and ignored (`extra="allow"`), `max_tokens` defaulting to 16 on completions,
and `stream_options` refused without `stream=true`. Anything speclab cannot honour (n > 1,
logprobs, echo, penalties) is refused with a 400 that says so, never silently dropped.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from speclab.sampling_params import SamplingParams


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as vLLM does


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = True
    continuous_usage_stats: bool = False


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str


class _SamplingRequest(OpenAIBaseModel):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Any = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return self

    def unsupported(self) -> str | None:
        """The first field this server cannot honour, as a message naming the fix, or None."""
        if self.n != 1:
            return f"n={self.n}: speclab serve generates one choice per request; send n=1 (or n separate requests)"
        if self.logprobs not in (None, False, 0):
            return "logprobs are not supported by speclab serve: leave logprobs unset"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return f"{name} is not supported by speclab serve (speclab's sampler has no penalties): leave it unset"
        return None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    def to_sampling_params(self, default_max_tokens: int, extra_stop_token_ids=()) -> SamplingParams:
        """vLLM's defaults where a field is unset (temperature 1, top_p 1, top_k 0); SamplingParams'
        own checks give the 400 messages (e.g. 'temperature must be non-negative, got -1.0')."""
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
            seed=self.seed,
            stop_token_ids=list(dict.fromkeys([*(self.stop_token_ids or []), *extra_stop_token_ids])),
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo is not supported by speclab serve: leave echo unset"
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            if len(self.prompt) != 1:
                return f"{len(self.prompt)} prompts in one request: speclab serve takes one prompt per request"
        return super().unsupported()

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        return p[0] if isinstance(p, list) and p and not isinstance(p[0], int) else p


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None

    def to_sampling_params(self, default_max_tokens: int, extra_stop_token_ids=()) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().to_sampling_params(default_max_tokens, extra_stop_token_ids)


# ----------------------------------------------------------------------------------------------
# responses (plain dicts: the wire format is the contract)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_choice(text: str, finish_reason: str | None, chat: bool, delta: bool, first: bool = False) -> dict:
    """One choice: a completion's `text`, a chat message, or a chat stream's `delta`."""
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
    if delta:
        body = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": 0, "delta": body, "logprobs": None, "finish_reason": finish_reason}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
            "finish_reason": finish_reason, "stop_reason": None}


def response_body(rid: str, model: str, choices: list[dict], chat: bool, delta: bool,
                  use: dict | None = None, created: int | None = None) -> dict:
    obj = ("chat.completion.chunk" if delta else "chat.completion") if chat else "text_completion"
    body = {"id": rid, "object": obj, "created": created or int(time.time()), "model": model, "choices": choices}
    if use is not None or not delta:
        body["usage"] = use
    return body


def error_body(message: str, status: int, type_: str = "BadRequestError", param: str | None = None) -> dict:
    """vLLM's error shape: {"error": {"message", "type", "param", "code"}} with the HTTP status as code."""
    return {"error": {"message": message, "type": type_, "param": param, "code": status}}


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}
FinishReason = Literal["stop", "length", "abort", "error"]
