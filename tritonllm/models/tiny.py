"""Tiny random-weight HF model folders for tests: transformers' own classes, so HF is the oracle.

`make_tiny_model` writes config.json, model.safetensors (float32), generation_config.json and a
byte-level BPE tokenizer trained on the small built-in corpus below, with a chat template. All
weights (norm weights and biases too, which HF would initialise to ones and zeros and so leave
untested) are drawn from one seeded generator, with a spread large enough that next-token
distributions are peaked and greedy decoding has clear winners rather than near-ties.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

TINY_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# mixtures of experts (models/moe.py): 8 experts, top-2, small experts, so interpreter runs stay short
TINY_MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM")
# bump when the folders' contents change, so stale caches are not reused
TINY_MODEL_VERSION = 1

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
TOKENIZER_VOCAB_SIZE = 640
WEIGHT_STD = 0.15
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

_CORPUS = """\
The engine reads a request, splits the prompt into tokens and schedules them in small steps.
Every step runs the model once over a flat batch of tokens from many requests at the same time.
Keys and values of past tokens stay in a paged cache, so a long story never needs to be copied.
When memory runs short, the scheduler pauses the newest request and resumes it a little later.
A river runs past the old mill, where children watch the wheel turn slowly in the morning light.
The baker opens her shop before dawn and the smell of warm bread drifts along the quiet street.
In the garden, bees move from flower to flower while the cat sleeps in a patch of summer sun.
The weather changed in the afternoon: clouds rolled in from the sea and rain fell until night.
She asked the assistant a simple question, and it answered with a short and helpful sentence.
Numbers such as 7, 42, 128 and 2048 appear in tables, in prices and in the sizes of models.
Good tests compare the new code with a trusted reference on random inputs of awkward shapes.
The library was quiet except for the sound of pages turning and a clock ticking on the wall.
"""
_SUBJECTS = ["The model", "A user", "The server", "Our team", "The kernel", "A student"]
_VERBS = ["writes", "reads", "tests", "measures", "explains", "improves"]
_OBJECTS = ["the answer.", "a long prompt.", "the cache.", "every token.", "the small story.", "its results."]


def training_corpus() -> list[str]:
    """The built-in English text the tiny tokenizer is trained on: paragraphs plus simple
    generated sentences for variety (no downloads)."""
    generated = [f"{s} {v} {o}" for s in _SUBJECTS for v in _VERBS for o in _OBJECTS]
    return _CORPUS.splitlines() * 4 + generated


def make_tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (640 tokens, specials first) trained on `training_corpus()`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(), trainer)
    # like Llama tokenizers: encode() prepends BOS (the chat template writes its own)
    bos_id = tokenizer.token_to_id("<|bos|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos_id)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
    )


def _tiny_config(
    architecture: str, vocab_size: int, bos_id: int, eos_id: int, pad_id: int
) -> transformers.PretrainedConfig:
    common = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        initializer_range=WEIGHT_STD,
    )
    if architecture == "LlamaForCausalLM":
        # Llama 3.1 scaling with a short original context, so all three frequency bands occur
        rope_scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        }
        return transformers.LlamaConfig(
            **common, rope_theta=500000.0, rope_scaling=rope_scaling, tie_word_embeddings=False
        )
    if architecture == "MistralForCausalLM":
        return transformers.MistralConfig(**common, rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False)
    if architecture == "Qwen2ForCausalLM":  # q/k/v biases are Qwen2's default
        return transformers.Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True)
    if architecture == "Qwen3ForCausalLM":
        # q/k norm; head_dim 128 with 4 heads != hidden 256 / 4, as in real Qwen3 models
        common["head_dim"] = 128
        return transformers.Qwen3Config(**common, rope_theta=1000000.0, tie_word_embeddings=True)
    moe = dict(num_experts_per_tok=2, intermediate_size=96)
    if architecture == "MixtralForCausalLM":
        return transformers.MixtralConfig(**{**common, **moe}, num_local_experts=8, rope_theta=1000000.0)
    if architecture in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        # Qwen3: head_dim 128 and a dense first layer (mlp_only_layers), experts renormalised; Qwen2: a
        # shared expert with its sigmoid gate, experts not renormalised
        qwen3 = architecture == "Qwen3MoeForCausalLM"
        extra = dict(head_dim=128, mlp_only_layers=[0], norm_topk_prob=True) if qwen3 else dict(
            shared_expert_intermediate_size=160, norm_topk_prob=False)  # fmt: skip
        config_class = transformers.Qwen3MoeConfig if qwen3 else transformers.Qwen2MoeConfig
        return config_class(**{**common, **extra}, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96,
                            rope_theta=1000000.0, tie_word_embeddings=False)  # fmt: skip
    if architecture == "GptOssForCausalLM":
        # sinks, an 8-token window on alternate layers, yarn RoPE, biases, clamped SwiGLU; experts of 96
        # (a multiple of 32: MXFP4 blocks)
        rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0}  # fmt: skip
        return transformers.GptOssConfig(**{**common, **moe}, num_local_experts=8, sliding_window=8,
                                         layer_types=["sliding_attention", "full_attention"], rope_parameters=rope,
                                         attention_bias=True, tie_word_embeddings=False)  # fmt: skip
    raise ValueError(
        f"no tiny model for {architecture!r}; choose one of {', '.join(TINY_ARCHITECTURES + TINY_MOE_ARCHITECTURES)}"
    )


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Fill every parameter from one seeded generator: norms ~ 1 + N(0, 0.1), biases ~ N(0, 0.1),
    matrices ~ N(0, WEIGHT_STD)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(WEIGHT_STD * noise)


def make_tiny_model(
    path: str | Path, architecture: str = "LlamaForCausalLM", seed: int = 0, **config_overrides: object
) -> Path:
    """Write a tiny random HF model folder (float32) for `architecture` at `path`; same seed, same files.
    config_overrides are set on the config before the model is built (e.g. sliding_window=8; for
    Qwen2/Qwen3 also layer_types, which their configs derive only at construction)."""
    folder = Path(path)
    tokenizer = make_tiny_tokenizer()
    bos_id, eos_id, pad_id = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    config = _tiny_config(architecture, len(tokenizer), bos_id, eos_id, pad_id)
    for name, value in config_overrides.items():
        setattr(config, name, value)
    model_class = getattr(transformers, architecture)
    # HF initialises weights from the global RNG: keep the caller's RNG state untouched
    with torch.random.fork_rng(devices=[]):
        model = model_class(config).to(torch.float32)
    _randomize(model, seed)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_cache_root() -> Path:
    return Path(os.environ.get("TRITONLLM_CACHE", Path.home() / ".cache" / "tritonllm")) / "tiny"


def tiny_model_path(architecture: str = "LlamaForCausalLM", **config_overrides: object) -> Path:
    """The cached tiny folder for `architecture` (seed 0; config_overrides as make_tiny_model's, e.g.
    sliding_window=8, name a separate folder), made on first use."""
    name = architecture + "".join(f"-{key}={value}" for key, value in sorted(config_overrides.items()))
    return _cached_folder(name, lambda folder: make_tiny_model(folder, architecture, **config_overrides))


def _cached_folder(name: str, make) -> Path:
    """tiny_cache_root()/v{version}/name, made by `make(folder)` on first use.

    Written to a temporary folder and renamed into place, so concurrent test processes never see
    a half-written model: the first rename wins and the others discard their copy.
    """
    final = tiny_cache_root() / f"v{TINY_MODEL_VERSION}" / name
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name.replace('/', '-')}-", dir=final.parent))
    try:
        make(tmp)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():  # not a lost race: a real failure
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# The fitted models' pattern: each token is the previous one plus one, counting through
# [FIT_FIRST, FIT_LAST) and wrapping; prompts that follow it (or jump, then follow) have clear answers.
FIT_FIRST, FIT_LAST = 10, 600
FIT_VERSION = 2  # bump when fit_tiny_model changes, so stale fitted folders are not reused


def fit_tiny_model(source: Path, out: Path, steps: int = 200, seed: int = 0) -> Path:
    """Train the tiny model at `source` briefly on the counting pattern and save it to `out`: its
    next-token distributions are then peaked, so quantization error shows as logprob differences
    rather than flipped near-ties (a random-weight model's flat distributions are full of them)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    model.train()
    span, length = FIT_LAST - FIT_FIRST, 48
    for _ in range(steps):
        # two runs of the pattern per sequence: the model learns to pick it up again after a jump
        starts = torch.randint(0, span, (32, 2), generator=gen)
        jump = torch.randint(8, length - 8, (32, 1), generator=gen)
        positions = torch.arange(length)
        offset = torch.where(positions < jump, starts[:, :1] + positions, starts[:, 1:] + positions - jump)
        tokens = FIT_FIRST + offset % span
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


def fitted_tiny_model_path(architecture: str = "LlamaForCausalLM") -> Path:
    """The cached tiny folder for `architecture`, fitted to the counting pattern (fit_tiny_model)."""
    source = tiny_model_path(architecture)
    return _cached_folder(f"fitted-v{FIT_VERSION}-{architecture}", lambda folder: fit_tiny_model(source, folder))
