"""Incremental detokenization and stop-string detection.

Decoding the whole output every step costs O(n^2); instead only a short window of recent tokens
is decoded, and text is released once it no longer ends in an incomplete UTF-8 sequence.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # start of the decoding window
        self.read_offset = 0  # tokens before this are already released as text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def append(self, token_id: int) -> str:
        """Add one generated token; returns the text it completes (may be empty)."""
        self.token_ids.append(token_id)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.token_ids)
            return new_text[len(prefix_text) :]
        return ""


def find_stop_string(text: str, num_new_chars: int, stops: list[str]) -> tuple[str, int] | None:
    """The first stop string that the last `num_new_chars` characters completed: (stop, index in text)."""
    best: tuple[str, int] | None = None
    for stop in stops:
        index = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
        if index != -1 and (best is None or index < best[1]):
            best = (stop, index)
    return best
