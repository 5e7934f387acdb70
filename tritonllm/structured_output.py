"""Structured outputs (vLLM's `structured_outputs`): a JSON schema, any JSON object, a regex, a choice
among strings or an EBNF grammar, enforced token by token with xgrammar's matchers.

The engine compiles a request's grammar when the request is added (a grammar that does not compile is
refused there, naming the problem) and gives each of its samples a `GrammarState`. Before each step
samples such a row, the model runner advances the row's matcher by the tokens generated since
(`catch_up`: under overlap scheduling the last one is still in flight and is read back from the device)
and asks it which tokens may come next: a bitmask the `sampling` op's `apply_token_bitmask` applies to
the logits. Logprobs stay the model's own (before the mask), as in vLLM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass
class StructuredOutputsParams:
    """Exactly one of: `json` (a JSON schema, as a dict or its text), `json_object=True` (any JSON
    object), `regex`, `choice` (one of these strings), `grammar` (EBNF, xgrammar's dialect)."""

    json: str | dict | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def _given(self) -> list[str]:
        """The kinds set (json_object by being true, the others by not being None)."""
        return [k for k in KINDS if (getattr(self, k) is not None if k != "json_object" else self.json_object)]

    def __post_init__(self) -> None:
        given = self._given()
        if len(given) != 1:
            raise ValueError(f"structured_outputs takes exactly one of {', '.join(KINDS)}; got {given or 'none'}")
        if self.choice is not None and (
            not isinstance(self.choice, list)
            or not self.choice
            or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError(
                f"structured_outputs.choice must be a non-empty list of non-empty strings, got {self.choice!r}"
            )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError(
                f"structured_outputs.json must be a JSON schema (an object or its text), got {self.json!r}"
            )

    @property
    def kind(self) -> str:
        return self._given()[0]


@dataclass(eq=False)
class GrammarState:
    """One sample's matcher and how many of its generated tokens the matcher has taken."""

    matcher: Any  # xgrammar.GrammarMatcher
    accepted: int = 0

    def catch_up(self, tokens: list[int], request_id: str) -> None:
        """Advance the matcher by `tokens` (those generated since it last advanced)."""
        for token in tokens:
            if not self.matcher.accept_token(token):
                raise RuntimeError(f"request {request_id}: token {token} breaks its structured output")
            self.accepted += 1

    def fill(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into bitmask row `row`; False once the grammar has ended (the stop
        token was accepted: nothing constrains the row any more)."""
        if self.matcher.is_terminated():
            return False
        self.matcher.fill_next_token_bitmask(bitmask, row)
        return True


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:  # an optional dependency (the `structured` extra)
        raise ValueError(
            "structured outputs need the xgrammar package: pip install xgrammar (or tritonllm[structured])"
        ) from e
    return xgrammar


@dataclass
class StructuredOutputs:
    """An engine's grammar compiler (xgrammar's, made on first use: it reads the whole vocabulary)."""

    tokenizer: Any
    vocab_size: int
    stop_token_ids: list[int]
    _compiler: Any = field(default=None, init=False, repr=False)

    @property
    def compiler(self):
        if self._compiler is None:
            xgr = _xgrammar()
            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids or None
            )
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of `params`; ValueError naming the problem if it does not compile."""
        compiler, kind = self.compiler, params.kind
        try:
            if kind == "json":
                schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
                return compiler.compile_json_schema(schema, any_whitespace=False)
            if kind == "json_object":
                return compiler.compile_builtin_json_grammar()
            if kind == "regex":
                return compiler.compile_regex(params.regex)
            if kind == "choice":  # EBNF string literals in JSON's escapes
                return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in params.choice))
            return compiler.compile_grammar(params.grammar)
        except Exception as e:  # xgrammar raises RuntimeError / ValueError subclasses with the parser's message
            raise ValueError(f"structured_outputs.{kind} does not compile: {e}".strip()) from e

    @staticmethod
    def state(compiled: Any) -> GrammarState:
        return GrammarState(_xgrammar().GrammarMatcher(compiled))
