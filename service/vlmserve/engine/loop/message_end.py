"""Where a prompt's last message ends, when the template will not render its generation prompt
again: the boundary the prefix cache keeps there for layers no prefix can be cut from
(kv/snapshots.py).

An agent's next turn resends the conversation with the model's answer where the generation
prompt was. Most templates render the generation prompt again as the start of that answer (Qwen's
`<|im_start|>assistant\\n`, Gemma 3's `<start_of_turn>model\\n`), so the state at the prompt's end
is one the next turn shares. Some do not: Gemma 4 with thinking off ends its generation prompt
with an empty thought channel (`<|turn>model\\n<|channel>thought\\n<channel|>`) that it leaves out
of the answer it renders, so the next prompt parts from the previous one 6 tokens before its end,
after the last boundary kept. For such a template the boundary is the end of the last message
(the prompt without its generation prompt), which every later turn shares whatever the answer
renders as.

Which generation prompts are not rendered again is probed once per model
(`rerendered_generation_prompts`): a one-message conversation with and without its generation
prompt, and with an answer after it, for each thinking switch a request may set.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["message_end", "rerendered_generation_prompts"]

log = logging.getLogger(__name__)

# The thinking switches a request may render with (prep/prompt.py passes `enable_thinking` when
# the request says, nothing otherwise).
_SWITCHES: tuple[dict[str, bool], ...] = ({}, {"enable_thinking": False}, {"enable_thinking": True})
_ASKED = [{"role": "user", "content": "Hi."}]
_ANSWERED = [*_ASKED, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again."}]


def rerendered_generation_prompts(template: Any, tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """The token ids of each generation prompt this template renders differently once the turn is
    answered (none for most templates; empty too when the template cannot render the probe)."""
    found: list[tuple[int, ...]] = []
    for switch in _SWITCHES:
        try:
            asking = _render(template, _ASKED, True, switch)
            asked = _render(template, _ASKED, False, switch)
            answered = _render(template, _ANSWERED, True, switch)
            if not all(isinstance(text, str) for text in (asking, asked, answered)):
                continue
            if answered.startswith(asking) or not asking.startswith(asked):
                continue  # rendered again (the prompt's end is shared), or no clean suffix
            with_prompt = list(tokenizer.encode(asking, add_special_tokens=False))
            without = list(tokenizer.encode(asked, add_special_tokens=False))
        except Exception as error:  # a template that cannot render the probe keeps the prompt's end
            log.debug("generation prompt probe failed: %s", error)
            continue
        suffix = tuple(int(i) for i in with_prompt[len(without) :])
        if with_prompt[: len(without)] == without and suffix and suffix not in found:
            found.append(suffix)
    return tuple(found)


def _render(template: Any, messages: list[dict[str, str]], generation: bool, switch: dict[str, bool]) -> Any:
    return template.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False, **switch)


def message_end(prompt_ids: Sequence[int], generation_prompts: Sequence[tuple[int, ...]]) -> int | None:
    """The position where the last message ends, when the prompt ends with one of
    `generation_prompts` (the longest that matches); else None."""
    best: int | None = None
    for suffix in generation_prompts:
        n = len(suffix)
        if 0 < n < len(prompt_ids) and tuple(prompt_ids[-n:]) == suffix:
            at = len(prompt_ids) - n
            best = at if best is None else min(best, at)
    return best
