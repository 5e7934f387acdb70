"""/tokenize and /detokenize, as vLLM serves them: token ids of a prompt (or of chat messages through
the chat template) with the count and the context length; the text of token ids. They run in a worker
thread, off the engine thread and the event loop."""

from __future__ import annotations

import asyncio

import jinja2
from pydantic import BaseModel

from tritonllm.entrypoints.openai.protocol import ChatMessage
from tritonllm.entrypoints.openai.serving import BadRequestError, OpenAIServing
from tritonllm.entrypoints.openai.serving_chat import _message, chat_prompt_ids


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class OpenAIServingTokenization(OpenAIServing):
    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise BadRequestError(f"model {model!r} is not served here: use model={self.served_model_name!r}")

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self._check_model(request.model)
        tokenizer = self.engine.engine.tokenizer
        if (request.prompt is None) == (request.messages is None):
            raise BadRequestError("give either prompt or messages")
        try:
            if request.messages is not None:
                messages = [_message(m) for m in request.messages]
                tokens = await asyncio.to_thread(chat_prompt_ids, tokenizer, messages, request.add_generation_prompt)
            else:
                tokens = await asyncio.to_thread(
                    tokenizer.encode, request.prompt, add_special_tokens=request.add_special_tokens
                )
        except (ValueError, jinja2.TemplateError) as e:
            raise BadRequestError(f"could not tokenize: {e}") from e
        return TokenizeResponse(count=len(tokens), max_model_len=self.engine.engine.max_model_len, tokens=list(tokens))

    async def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self._check_model(request.model)
        tokenizer = self.engine.engine.tokenizer
        vocab = len(tokenizer)
        bad = [t for t in request.tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        return DetokenizeResponse(prompt=await asyncio.to_thread(tokenizer.decode, request.tokens))
