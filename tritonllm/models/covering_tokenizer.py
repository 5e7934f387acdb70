"""A fast tokenizer whose vocabulary covers a model's: for random-weight benchmark models.

A real model's tokenizer turns every id the model can sample into text; the tiny trained one
has a few hundred tokens, so most ids of a 150k-token model would decode to nothing and
detokenization would cost nothing (or, worse, pile up). This builds a byte-level BPE tokenizer
with exactly `vocab_size` ids, as Qwen's and Llama-3's are: the 256 byte symbols, then
letter strings with and without a leading space (" ab", "abc", ...) in breadth-first order, each
with the merge (its prefix, its last letter), so every token is reachable and decodes to text;
special tokens sit at the ids the model's config gives them.
"""

from __future__ import annotations

from collections import deque
from string import ascii_lowercase

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tritonllm.models.tiny import CHAT_TEMPLATE

_SPACE = "\u0120"  # the byte-level symbol of " "


def _letter_strings():
    """(stem, letter) of every letter string of two or more symbols, optionally after a space,
    shortest first: each one's stem comes before it."""
    stems = deque([_SPACE, *ascii_lowercase])
    while True:
        stem = stems.popleft()
        for letter in ascii_lowercase:
            stems.append(stem + letter)
            yield stem, letter


def make_covering_tokenizer(vocab_size: int, special_tokens: dict[int, str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of exactly `vocab_size` ids; `special_tokens` maps ids to names
    ("<|bos|>" and "<|eos|>" become the BOS and EOS tokens when present)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < len(alphabet) + len(special_tokens) or any(not 0 <= i < vocab_size for i in special_tokens):
        raise ValueError(
            f"vocab_size {vocab_size} cannot hold the 256 byte symbols and special ids {sorted(special_tokens)}"
        )
    free_ids = (i for i in range(vocab_size) if i not in special_tokens)
    vocab = {symbol: next(free_ids) for symbol in alphabet}
    merges: list[tuple[str, str]] = []
    for token_id, (stem, letter) in zip(free_ids, _letter_strings()):
        vocab[stem + letter] = token_id
        merges.append((stem, letter))
    for token_id, name in special_tokens.items():
        vocab[name] = token_id
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in special_tokens.values()])
    names = set(special_tokens.values())
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>" if "<|bos|>" in names else None,
        eos_token="<|eos|>" if "<|eos|>" in names else None,
        chat_template=CHAT_TEMPLATE,
    )
