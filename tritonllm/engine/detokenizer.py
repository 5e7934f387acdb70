"""Incremental detokenization at O(1) per token, token strings for logprobs, and stop strings.

Fast tokenizers (a `tokenizers.Tokenizer` behind the transformers object, as every tokenizer.json
folder has) stream through `tokenizers.decoders.DecodeStream`: one Rust call per token, which
holds back the tokens of an incomplete UTF-8 character. Slow (Python) tokenizers fall back to a
window of recent tokens decoded twice per token. Either way the text held back is bounded: a
token that decodes to nothing (an id outside the tokenizer's vocabulary, a skipped special token)
would otherwise make the pending window grow with every token, and decoding turn quadratic; after
MAX_PENDING_TOKENS tokens without text the pending tokens are released as they decode.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

# A character spans at most 4 UTF-8 bytes (4 byte-level or byte-fallback tokens); twice that
# without text means the tokens decode to nothing.
MAX_PENDING_TOKENS = 8


def backend_tokenizer(tokenizer: PreTrainedTokenizerBase) -> Tokenizer | None:
    """The `tokenizers.Tokenizer` of a fast transformers tokenizer; None for a slow one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


class StreamDetokenizer:
    """A fast tokenizer's incremental decoder: DecodeStream, with the pending run bounded."""

    def __init__(self, backend: Tokenizer, skip_special_tokens: bool) -> None:
        self.backend = backend
        self.skip_special_tokens = skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.pending: list[int] = []  # tokens since the last text released

    def append(self, token_id: int) -> str:
        """Add one generated token; returns the text it completes (may be empty)."""
        try:
            text = self.stream.step(self.backend, token_id)
        except Exception:  # a decoder whose output is not prefix-stable: restart from this token
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            self.pending = []
            return self.backend.decode([token_id], skip_special_tokens=self.skip_special_tokens)
        if text is not None:
            self.pending.clear()
            return text
        self.pending.append(token_id)
        if len(self.pending) < MAX_PENDING_TOKENS:
            return ""
        return self.flush()

    def flush(self) -> str:
        """The text of the tokens held back (an incomplete character decodes as U+FFFD, as the
        whole output would); the stream starts afresh. Called when the request finishes."""
        if not self.pending:
            return ""
        text = self.backend.decode(self.pending, skip_special_tokens=self.skip_special_tokens)
        self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
        self.pending = []
        return text


class WindowDetokenizer:
    """A slow tokenizer's incremental decoder: the text of a short window of recent tokens, released
    once it no longer ends in an incomplete UTF-8 sequence (or after MAX_PENDING_TOKENS tokens)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.window: list[int] = []  # the last released run of tokens (context), then the pending ones
        self.num_context = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def append(self, token_id: int) -> str:
        self.window.append(token_id)
        prefix_text = self._decode(self.window[: self.num_context])
        new_text = self._decode(self.window)
        complete = len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd")
        if not complete and len(self.window) - self.num_context < MAX_PENDING_TOKENS:
            return ""
        return self._release(prefix_text, new_text)

    def _release(self, prefix_text: str, new_text: str) -> str:
        self.window = self.window[self.num_context :]
        self.num_context = len(self.window)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """The text of the tokens held back, as the whole output decodes them."""
        if len(self.window) == self.num_context:
            return ""
        return self._release(self._decode(self.window[: self.num_context]), self._decode(self.window))


Detokenizer = StreamDetokenizer | WindowDetokenizer


def make_detokenizer(tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool) -> Detokenizer:
    backend = backend_tokenizer(tokenizer)
    if backend is not None:
        return StreamDetokenizer(backend, skip_special_tokens)
    return WindowDetokenizer(tokenizer, skip_special_tokens)


class TokenStrings:
    """Each token id's own text, as logprob entries show it: ids not seen before are decoded in one
    batched call per step (`add`), then served from a table."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.backend = backend_tokenizer(tokenizer)
        self.table: dict[int, str] = {}

    def add(self, token_ids: Iterable[int]) -> None:
        missing = [t for t in set(token_ids) if t not in self.table]
        if not missing:
            return
        singles = [[t] for t in missing]
        if self.backend is not None:
            texts = self.backend.decode_batch(singles, skip_special_tokens=False)
        else:
            texts = self.tokenizer.batch_decode(singles, skip_special_tokens=False)
        self.table.update(zip(missing, texts))

    def __getitem__(self, token_id: int) -> str:
        return self.table[token_id]


def find_stop_string(text: str, num_new_chars: int, stops: list[str]) -> tuple[str, int] | None:
    """The first stop string that the last `num_new_chars` characters completed: (stop, index in text)."""
    best: tuple[str, int] | None = None
    for stop in stops:
        index = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
        if index != -1 and (best is None or index < best[1]):
            best = (stop, index)
    return best
