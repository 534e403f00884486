"""Rendered prompt -> token ids, where only the chat template's own markup is special.

Client text is tokenized with special tokens treated as text (as mlx-lm and vLLM do): a user who
types `<|im_end|>` gets the characters, not the control token, so cannot forge a turn, and a
typed `<|image_pad|>` is not an image slot. How: before rendering, every special-token string
inside client strings is swapped for a per-request placeholder (`protect_conversation`); after
rendering, the special tokens still in the text are the template's markup. The text between them
is tokenized with special tokens off and the placeholders restored. Ordinary prompts (no special
strings in client text) tokenize exactly as `tokenizer(text)` does: the same split at special
tokens, the same pieces, the same post-processor.

No MLX: runs in request-preparation worker threads. The backend `tokenizers.Tokenizer` copies
made here are private, so no call changes state another thread sees.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vlmserve.engine.request_errors import invalid_argument

__all__ = ["PromptTokenizer", "Protection"]


@dataclass(slots=True)
class Protection:
    """The placeholders of one request: placeholder -> the client text it stands for."""

    nonce: str = field(default_factory=lambda: secrets.token_hex(8))
    originals: dict[str, str] = field(default_factory=dict)

    def placeholder(self, original: str) -> str:
        # ASCII, so JSON escaping in a template (or in fitting it) leaves it as it is.
        key = f"[vlmserve-{self.nonce}-{len(self.originals)}]"
        self.originals[key] = original
        return key


class PromptTokenizer:
    """Tokenizes rendered prompts for one model (thread-safe: nothing shared is mutated)."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import Tokenizer

        backend = getattr(tokenizer, "_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            raise TypeError(f"{type(tokenizer).__name__} has no `tokenizers` backend")
        serialized = backend.to_str()
        # Client text: special-token strings are plain characters (non-special added tokens
        # such as `<tool_call>` still match, as they do in any tokenizer call).
        self._text = Tokenizer.from_str(serialized)
        # Text after a special token: a SentencePiece-style pre-tokenizer that marks only the
        # first piece of an input with "▁" (Metaspace prepend_scheme "first", Llama 2 / LLaVA)
        # must not mark it again, as it does not when the whole prompt is one input.
        self._text_after_special = Tokenizer.from_str(_without_first_prepend(serialized))
        for copy in (self._text, self._text_after_special):
            copy.encode_special_tokens = True
            copy.no_truncation()
            copy.no_padding()
        specials = sorted(
            (t.content for t in backend.get_added_tokens_decoder().values() if t.special and t.content),
            key=len,
            reverse=True,
        )
        self._special_ids: dict[str, int] = {text: backend.token_to_id(text) or 0 for text in specials}
        self._special = re.compile("|".join(re.escape(text) for text in specials)) if specials else None
        self._wrapping = _wrapping(Tokenizer.from_str(serialized))
        vocab = backend.get_vocab(with_added_tokens=True)
        # A token never stands for more UTF-8 bytes than its own string has (byte-level BPE
        # spells a byte with one or two; SentencePiece's `▁` is three for one space), so
        # bytes / this is a lower bound on the token count of any text.
        self.max_token_bytes = max((len(token.encode("utf-8")) for token in vocab), default=1) or 1

    # -- client strings (before rendering) --------------------------------------------------

    def protect(self, value: Any, protection: Protection) -> Any:
        """`value` (template inputs: dicts, lists, strings) with special-token strings inside its
        strings replaced by placeholders. Returns `value` itself when there is nothing to replace."""
        if isinstance(value, str):
            if self._special is None or not self._special.search(value):
                return value
            return self._special.sub(lambda match: protection.placeholder(match.group(0)), value)
        if isinstance(value, dict):
            changed = {key: self.protect(item, protection) for key, item in value.items()}
            return changed if any(changed[k] is not value[k] for k in value) else value
        if isinstance(value, list):
            items = [self.protect(item, protection) for item in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        return value

    # -- the rendered prompt ----------------------------------------------------------------

    def minimum_tokens(self, text: str) -> int:
        """A lower bound on the token count of `text`, without tokenizing it."""
        return len(text.encode("utf-8", errors="surrogatepass")) // self.max_token_bytes

    def restore(self, text: str, protection: Protection) -> str:
        """The rendered text as the model reads it: placeholders back to the client's text."""
        if not protection.originals:
            return text
        for key, original in protection.originals.items():
            text = text.replace(key, original)
        if protection.nonce in text:
            # The template changed a placeholder (escaped or cut it): its text cannot be kept
            # as text, and dropping it silently is not an option.
            shown = ", ".join(sorted({repr(o) for o in protection.originals.values()}))
            raise invalid_argument(
                f"the text contains {shown}, the model's control-token spelling, in a place this "
                "model's chat template cannot carry as plain text; remove it",
                field="messages",
            )
        return text

    def encode(self, rendered: str, protection: Protection, *, add_special_tokens: bool) -> list[int]:
        """Token ids of `rendered` (placeholders still in): markup special, the rest text.

        `add_special_tokens`: what the tokenizer's post-processor adds around a text (a BOS).
        """
        prefix, suffix = self._wrapping if add_special_tokens else ((), ())
        ids = list(prefix)
        start = 0
        matches: Iterable[re.Match[str]] = self._special.finditer(rendered) if self._special else ()
        for match in matches:
            ids += self._encode_text(rendered[start : match.start()], protection, first=start == 0)
            ids.append(self._special_ids[match.group(0)])
            start = match.end()
        ids += self._encode_text(rendered[start:], protection, first=start == 0)
        ids += suffix
        return ids

    def _encode_text(self, text: str, protection: Protection, *, first: bool) -> list[int]:
        if not text:
            return []
        if protection.originals and protection.nonce in text:
            text = self.restore(text, protection)
        tokenizer = self._text if first else self._text_after_special
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def _without_first_prepend(serialized: str) -> str:
    """The tokenizer JSON with Metaspace's prepend_scheme "first" turned to "never"."""
    import json

    data = json.loads(serialized)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
                node["prepend_scheme"] = "never"
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data.get("pre_tokenizer"))
    return json.dumps(data)


def _wrapping(backend: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What the tokenizer's post-processor puts around a text (e.g. BOS), found by difference."""
    bare = backend.encode("x", add_special_tokens=False).ids
    wrapped = backend.encode("x", add_special_tokens=True).ids
    for start in range(len(wrapped) - len(bare) + 1):
        if wrapped[start : start + len(bare)] == bare:
            return tuple(wrapped[:start]), tuple(wrapped[start + len(bare) :])
    return (), ()
