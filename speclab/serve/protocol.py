"""The OpenAI-compatible request and response shapes, and their translation into SamplingParams.

Shaped like vLLM's `vllm/entrypoints/openai/protocol.py`: the OpenAI fields a small server needs,
vLLM's sampling extras as far as speclab's sampler has them (`top_k`, `ignore_eos`,
`stop_token_ids`), `max_tokens` defaulting to 16 on completions, `stream_options` refused without
`stream=true`.

Three kinds of field:
  * honoured: model, prompt / messages, max_tokens (max_completion_tokens), temperature, top_p,
    top_k, seed, stop, stop_token_ids, ignore_eos, stream, stream_options (include_usage,
    continuous_usage_stats), add_special_tokens (completions), add_generation_prompt (chat), and
    every field below at its no-op value (n=1, logprobs=null, min_tokens=0, min_p=0, ...);
  * known but not honoured (`UNSUPPORTED`): a value other than the no-op one gets a 400 naming the
    field and the fix, never a 200 that silently ignored it;
  * unknown: accepted and ignored, as vLLM does (`extra="allow"`), with one log line per field name.
"""

from __future__ import annotations

import logging
import numbers
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from speclab.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class RequestProblem(ValueError):
    """A request the server refuses (HTTP 400): `param` names the field, the message the fix."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as vLLM does


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = True
    continuous_usage_stats: bool = False


class ChatMessage(OpenAIBaseModel):
    role: str
    content: Any = None

    def text(self, i: int) -> str:
        """The content as one string: a string, or a list of {"type": "text", "text": ...} parts."""
        c = self.content
        if isinstance(c, str):
            return c
        if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                       for p in c):
            return "".join(p["text"] for p in c)
        raise RequestProblem(f"messages[{i}].content must be a string or a list of {{'type': 'text', 'text': ...}} "
                             f"parts (speclab serves text-only models), got {str(c)[:60]!r}", f"messages.{i}.content")


def _off(default):
    return lambda v: v is None or v == default


_EMPTY = lambda v: v is None or v == [] or v == {} or v == ""  # noqa: E731
_UNSET = lambda v: v is None  # noqa: E731 - any value asks for something (guided_json={} asks for JSON)
# field -> (is the value a no-op?, the fix). The values that do nothing are accepted; anything else is a 400.
UNSUPPORTED = {
    "n": (_off(1), "speclab serve generates one choice per request: send n=1 (or n separate requests)"),
    "best_of": (_off(1), "speclab serve generates one candidate per request: leave best_of unset (or 1)"),
    "logprobs": (lambda v: v is None or v is False, "speclab serve returns no log probabilities: leave logprobs unset"),
    "top_logprobs": (_off(0), "speclab serve returns no log probabilities: leave top_logprobs unset"),
    "prompt_logprobs": (lambda v: v is None, "speclab serve returns no log probabilities: leave prompt_logprobs unset"),
    "echo": (_off(False), "speclab serve does not echo the prompt: leave echo unset"),
    "suffix": (_EMPTY, "speclab serve does not insert a suffix (fill-in-the-middle): leave suffix unset"),
    "logit_bias": (_EMPTY, "speclab's sampler has no logit bias: leave logit_bias unset"),
    "presence_penalty": (_off(0), "speclab's sampler has no penalties: leave presence_penalty unset"),
    "frequency_penalty": (_off(0), "speclab's sampler has no penalties: leave frequency_penalty unset"),
    "repetition_penalty": (_off(1), "speclab's sampler has no penalties: leave repetition_penalty unset (or 1)"),
    "length_penalty": (_off(1), "speclab serve has no beam search: leave length_penalty unset (or 1)"),
    "use_beam_search": (_off(False), "speclab serve has no beam search: leave use_beam_search unset"),
    "min_tokens": (_off(0), "speclab's sampler cannot forbid early stops: leave min_tokens unset (or set "
                            "ignore_eos=true and max_tokens for an exact length)"),
    "min_p": (_off(0), "speclab's sampler has temperature, top_k and top_p only: leave min_p unset (or 0)"),
    "allowed_token_ids": (_EMPTY, "speclab's sampler cannot restrict the vocabulary: leave allowed_token_ids unset"),
    "bad_words": (_EMPTY, "speclab's sampler cannot ban words: leave bad_words unset"),
    "include_stop_str_in_output": (_off(False), "speclab serve ends the text before a stop string: leave "
                                                "include_stop_str_in_output unset"),
    "skip_special_tokens": (_off(True), "speclab serve always skips special tokens: leave skip_special_tokens unset"),
    "spaces_between_special_tokens": (_off(True), "speclab serve always skips special tokens: leave "
                                                  "spaces_between_special_tokens unset"),
    "truncate_prompt_tokens": (lambda v: v is None, "speclab serve never truncates a prompt: shorten it yourself"),
    "response_format": (lambda v: v is None or v == {"type": "text"},
                        "speclab serve has no structured output: leave response_format unset (or {'type': 'text'})"),
    "structured_outputs": (_UNSET, "speclab serve has no structured output: leave structured_outputs unset"),
    "guided_json": (_UNSET, "speclab serve has no structured output: leave guided_json unset"),
    "guided_regex": (_UNSET, "speclab serve has no structured output: leave guided_regex unset"),
    "guided_choice": (_UNSET, "speclab serve has no structured output: leave guided_choice unset"),
    "guided_grammar": (_UNSET, "speclab serve has no structured output: leave guided_grammar unset"),
    "tools": (_EMPTY, "speclab serve has no tool calling: leave tools unset"),
    "tool_choice": (lambda v: v is None or v == "none", "speclab serve has no tool calling: leave tool_choice unset"),
    "functions": (_EMPTY, "speclab serve has no function calling: leave functions unset"),
    "function_call": (lambda v: v is None or v == "none", "speclab serve has no function calling: leave "
                                                          "function_call unset"),
    "logits_processors": (_EMPTY, "speclab serve runs no custom logits processors: leave logits_processors unset"),
    "prediction": (_EMPTY, "speclab serve takes no predicted output (use --speculative-config for speculation): "
                           "leave prediction unset"),
    "audio": (_EMPTY, "speclab serve is text-only: leave audio unset"),
    "modalities": (lambda v: v is None or v == ["text"], "speclab serve is text-only: leave modalities unset"),
    "priority": (_off(0), "speclab's scheduler is first-come first-served: leave priority unset (or 0)"),
    "continue_final_message": (_off(False), "speclab serve always starts a new assistant turn: leave "
                                            "continue_final_message unset"),
    "chat_template": (_EMPTY, "the chat template is the server's (--chat-template): leave chat_template unset"),
    "chat_template_kwargs": (_EMPTY, "the chat template takes no extra arguments here: leave chat_template_kwargs unset"),
}
_warned: set[str] = set()
MAX_STOP_STRINGS, MAX_STOP_CHARS = 64, 16384  # OpenAI allows 4 stop strings; a bound keeps each step's search small


def check_text(value: str, param: str) -> str:
    """Refuse a string that is not valid Unicode (a lone UTF-16 surrogate from JSON's \\ud800 escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestProblem(f"{param} contains a lone UTF-16 surrogate ({value[e.start]!r} at character {e.start}), "
                             f"which is not valid Unicode: send a complete surrogate pair or the character itself",
                             param) from None
    return value


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
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return self

    def field(self, name: str, default=None):
        """A field's value, declared or extra (the protocol accepts unknown fields)."""
        if name in type(self).model_fields:
            return getattr(self, name)
        return (self.model_extra or {}).get(name, default)

    def check_supported(self) -> None:
        """Raise a RequestProblem naming the first field this server cannot honour; log unknown fields once."""
        for name, (is_noop, fix) in UNSUPPORTED.items():
            value = self.field(name)
            if not is_noop(value):
                raise RequestProblem(f"{name}={str(value)[:60]}: {fix}", name)
        unknown = sorted(set(self.model_extra or {}) - set(UNSUPPORTED) - _HONOURED_EXTRAS - _warned)
        if unknown:
            _warned.update(unknown)
            logger.warning("The following fields were present in the request but ignored: %s", unknown)

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise RequestProblem("stop strings must be non-empty", "stop")
        if len(stops) > MAX_STOP_STRINGS or sum(map(len, stops)) > MAX_STOP_CHARS:
            raise RequestProblem(f"{len(stops)} stop strings of {sum(map(len, stops))} characters: at most "
                                 f"{MAX_STOP_STRINGS} of {MAX_STOP_CHARS} characters in all (each is searched for "
                                 f"after every step)", "stop")
        return [check_text(s, "stop") for s in stops]

    def to_sampling_params(self, default_max_tokens: int, extra_stop_token_ids=()) -> SamplingParams:
        """vLLM's defaults where a field is unset (temperature 1, top_p 1, top_k 0); SamplingParams'
        own checks give the 400 messages (e.g. 'temperature must be non-negative, got -1.0')."""
        try:
            return SamplingParams(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=0 if self.top_k is None else self.top_k,
                max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
                seed=self.seed,
                stop_token_ids=list(dict.fromkeys([*(self.stop_token_ids or []), *extra_stop_token_ids])),
                ignore_eos=self.ignore_eos,
            )
        except ValueError as e:
            raise RequestProblem(str(e), str(e).split(" ")[0].split("=")[0]) from None


_HONOURED_EXTRAS = {"add_special_tokens", "add_generation_prompt", "user", "metadata", "store", "request_id",
                    "service_tier", "parallel_tool_calls", "cache_salt"}  # honoured, or metadata with no effect


class CompletionRequest(_SamplingRequest):
    prompt: Any

    def prompt_text_or_ids(self) -> str | list[int]:
        """The one prompt: a string or a list of token ids (OpenAI also allows a one-element list of either)."""
        p = self.prompt
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]
        elif isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
            raise RequestProblem(f"{len(p)} prompts in one request: speclab serve takes one prompt per request "
                                 f"(send them as separate requests)", "prompt")
        if isinstance(p, str):
            if not p:
                raise RequestProblem("prompt is empty: give at least one character or token id", "prompt")
            return check_text(p, "prompt")
        if isinstance(p, list) and p:
            bad = next(((i, t) for i, t in enumerate(p) if isinstance(t, bool) or not isinstance(t, numbers.Integral)),
                       None)
            if bad is not None:
                raise RequestProblem(f"prompt token ids must be integers, got {str(bad[1])[:40]!r} at index {bad[0]}: "
                                     f"send a string, or a list of integer token ids", "prompt")
            return list(p)
        raise RequestProblem(f"prompt must be a string or a non-empty list of integer token ids, got "
                             f"{type(p).__name__} {str(p)[:40]!r}", "prompt")


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None

    def message_dicts(self) -> list[dict]:
        return [{"role": m.role, "content": check_text(m.text(i), f"messages.{i}.content")}
                for i, m in enumerate(self.messages)]

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


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
               404: "NotFoundError", 405: "MethodNotAllowedError", 413: "RequestEntityTooLargeError",
               422: "UnprocessableEntityError", 429: "RateLimitError", 499: "ClientClosedRequest",
               500: "InternalServerError", 503: "ServiceUnavailableError"}


def error_body(message: str, status: int, type_: str | None = None, param: str | None = None) -> dict:
    """vLLM's error shape, for every 4xx and 5xx: {"error": {"message", "type", "param", "code"}}, code = status."""
    return {"error": {"message": message, "type": type_ or ERROR_TYPES.get(status, "Error"), "param": param,
                      "code": status}}


FinishReason = Literal["stop", "length", "abort", "error"]
