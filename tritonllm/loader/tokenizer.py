"""The tokenizer of a local model folder, and its chat template."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from tritonllm.loader.gguf_loader import gguf_file


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer (fast when tokenizer.json exists), or a GGUF file's (transformers
    builds it from the file's tokenizer.ggml metadata); never touches the network."""
    gguf = gguf_file(path)
    if gguf is not None:
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    return AutoTokenizer.from_pretrained(Path(path), local_files_only=True)


def render_chat(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], add_generation_prompt: bool = True
) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}]) under the tokenizer's chat template."""
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat_template: send a plain prompt, or a model whose "
            "tokenizer_config.json defines one"
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode_chat(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of the rendered chat. The template writes its own special tokens (BOS), so the
    tokenizer must not add them again."""
    text = render_chat(tokenizer, messages, add_generation_prompt)
    return tokenizer.encode(text, add_special_tokens=False)
