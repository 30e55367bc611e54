"""Chat: a conversation (a list of messages) through the tokenizer's chat template, to token ids.

An instruct model such as SmolLM2-135M-Instruct is trained on conversations rendered by its chat
template (ChatML here: `<|im_start|>user\\n...<|im_end|>\\n`), and it ends its turn with the
template's end token (`<|im_end|>`), not with a plain-text end. So a chat request is

    ids  = chat_prompt_ids(tokenizer, messages)          # the rendered conversation + "assistant\\n"
    stop = chat_stop_token_ids(tokenizer)                # e.g. [<|im_end|>] (and the tokenizer's eos)

and `LLM.chat(messages, params)` (vLLM's offline chat API) is `LLM.generate` on
`{"prompt_token_ids": ids}` with `stop` added to `params.stop_token_ids`.
"""

from __future__ import annotations

ROLES = ("system", "user", "assistant", "tool")


def validate_messages(messages) -> list[dict]:
    """Check one conversation: a non-empty list of {"role": str, "content": str} dicts.

    Returns:
        the messages as a list of plain dicts (extra keys such as "name" are kept).

    Raises:
        ValueError: naming the first message that is wrong and what was expected.
    """
    if isinstance(messages, (str, dict)) or not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, "
                         f"got {type(messages).__name__} {str(messages)[:60]!r}; for plain text use LLM.generate")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {str(m)[:80]!r}")
        if m["role"] not in ROLES:
            raise ValueError(f"message {i} has role {m['role']!r}: use one of {ROLES}")
        if not isinstance(m["content"], str):
            raise ValueError(f"message {i} content must be a string, got {type(m['content']).__name__}")
    return [dict(m) for m in messages]


def conversations(messages) -> list[list[dict]]:
    """One conversation or a list of conversations (as vLLM's `LLM.chat` accepts) -> a list of them."""
    if isinstance(messages, (list, tuple)) and messages and isinstance(messages[0], (list, tuple)):
        return [validate_messages(c) for c in messages]
    return [validate_messages(messages)]


def _check_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(f"tokenizer {name!r} has no chat template: chat needs an instruct model "
                         f"(e.g. LLM(model='smollm2')); use LLM.generate with plain prompts for this one")


def chat_prompt_text(tokenizer, messages, add_generation_prompt: bool = True) -> str:
    """The conversation rendered by the tokenizer's chat template (a string, specials included)."""
    _check_template(tokenizer)
    return tokenizer.apply_chat_template(validate_messages(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def chat_prompt_ids(tokenizer, messages, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of one conversation, ready for `LLM.generate([{"prompt_token_ids": ids}], ...)`.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (e.g. `LLM(model="smollm2").tokenizer`).
        messages: [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...].
        add_generation_prompt: end with the assistant's turn opener (`<|im_start|>assistant\\n`) so
            that the model answers; False renders the conversation as it stands.

    Returns:
        the ids of the rendered text; the template writes its own special tokens, so no BOS is added.
    """
    text = chat_prompt_text(tokenizer, messages, add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))


def chat_stop_token_ids(tokenizer) -> list[int]:
    """Tokens that end an assistant turn: the template's end-of-turn token, then the tokenizer's eos.

    The end-of-turn token is found by rendering a one-message conversation and taking the first
    special token after the content (`<|im_end|>` for ChatML, `<|eot_id|>` for Llama 3), so no
    template's token is hard-coded. Add these to `SamplingParams.stop_token_ids` for a chat request.
    """
    _check_template(tokenizer)
    marker = "speclab-chat-marker"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                         add_generation_prompt=False)
    tail = tokenizer.encode(text.split(marker, 1)[1], add_special_tokens=False)
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    stops = [t for t in tail if t in special][:1]
    if tokenizer.eos_token_id is not None:
        stops.append(tokenizer.eos_token_id)
    if not stops:
        raise ValueError("cannot tell which token ends a chat turn: the template writes no special token "
                         "after a message and the tokenizer has no eos_token; pass stop_token_ids yourself")
    return list(dict.fromkeys(stops))
