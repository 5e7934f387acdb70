"""Output processing (as vLLM v1's output processor): a step's sampled tokens become request state
and `RequestOutput`s — tokens appended, logprob dicts built, text detokenized, stops checked.

Apart from the step itself, so it can run while the GPU computes the next step (overlap
scheduling hands it step N's results after step N+1 is launched). A request that finished or was
aborted while a step was in flight gets that step's token discarded, never emitted.

Detokenization is incremental (O(1) per token, detokenizer.py) where someone reads the text
before the end: streamed (CUMULATIVE) requests and requests with stop strings. A FINAL_ONLY request
without stop strings (offline `generate`) is decoded once, when it finishes, in one batched call
with the other requests finishing in the same step. Logprob token strings of a step are decoded
in one batched call too (TokenStrings).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from tritonllm.engine.detokenizer import (
    Detokenizer,
    TokenStrings,
    backend_tokenizer,
    find_stop_string,
    make_detokenizer,
)
from tritonllm.engine.request import Request, RequestStatus
from tritonllm.engine.scheduler import Scheduler
from tritonllm.layers.sampler import TopLogprobs
from tritonllm.metrics.stats import EngineStats
from tritonllm.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestMetrics, RequestOutput
from tritonllm.sampling_params import RequestOutputKind

# (top ids, top logprobs, the sampled token's logprob, its rank)
SampledLogprobs = tuple[list[int], list[float], float, int]


@dataclass
class StepResult:
    """What one step produced, on the host."""

    sampled: list[Request]  # the requests that sampled a token, in row order
    token_ids: list[int]  # one per sampled request
    logprobs: list[SampledLogprobs | None] | None  # one per sampled request, None when no row asked
    # (request, first prompt position covered, TopLogprobs of consecutive prompt positions)
    prompt_logprobs: list[tuple[Request, int, TopLogprobs]]


@dataclass
class RequestGroup:
    """One user request: its prompt and its `n` engine requests."""

    request_id: str
    prompt: str | None
    children: list[Request]
    detokenizers: list[Detokenizer] | None  # None: decoded once, at the end
    final_only: bool
    delta: bool = False  # RequestOutputKind.DELTA: outputs carry only what is new
    # DELTA: per child, the tokens and characters already returned; the prompt logprobs returned
    sent_tokens: list[int] = field(default_factory=list)
    sent_chars: list[int] = field(default_factory=list)
    sent_prompt_logprobs: int = 0
    hold_back_chars: int = 0  # the longest stop string - 1: text a stop string may still cut

    @property
    def finished(self) -> bool:
        children = self.children
        return children[0].is_finished if len(children) == 1 else all(c.is_finished for c in children)


class OutputProcessor:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        max_model_len: int,
        scheduler: Scheduler,
        stats: EngineStats,
    ) -> None:
        self.tokenizer = tokenizer
        self.backend = backend_tokenizer(tokenizer)
        self.max_model_len = max_model_len
        self.scheduler = scheduler  # a finished request leaves it at once (its blocks are freed)
        self.token_strings = TokenStrings(tokenizer)
        self.stats = stats
        self.groups: dict[str, RequestGroup] = {}

    # ---- requests ------------------------------------------------------------------------

    def add_group(self, request_id: str, prompt: str | None, children: list[Request]) -> None:
        params = children[0].params
        final_only = params.output_kind is RequestOutputKind.FINAL_ONLY
        incremental = params.detokenize and (not final_only or bool(params.stop_strings))
        detoks = (
            [make_detokenizer(self.tokenizer, params.skip_special_tokens) for _ in children] if incremental else None
        )
        for i, child in enumerate(children):
            child.group_index = i
        group = RequestGroup(request_id, prompt, children, detoks, final_only)
        if params.output_kind is RequestOutputKind.DELTA:
            group.delta = True
            group.sent_tokens, group.sent_chars = [0] * len(children), [0] * len(children)
            group.hold_back_chars = max((len(s) for s in params.stop_strings), default=1) - 1
        self.groups[request_id] = group

    def pop_group(self, request_id: str) -> RequestGroup | None:
        return self.groups.pop(request_id, None)

    @staticmethod
    def group_id(request: Request) -> str:
        return request.request_id.rsplit("#", 1)[0] if request.params.n > 1 else request.request_id

    # ---- one step's results --------------------------------------------------------------

    def process(self, result: StepResult, now: float) -> list[RequestOutput]:
        """Apply a step's results; returns the outputs of the groups it advanced (CUMULATIVE) or
        finished (FINAL_ONLY). A finished group is last seen here and forgotten."""
        self._add_token_strings(result)
        touched: dict[str, RequestGroup] = {}
        for request, first_pos, top in result.prompt_logprobs:
            if not request.is_finished:
                self._append_prompt_logprobs(request, first_pos, top)
                group = self.groups[self.group_id(request)]
                touched[group.request_id] = group
        logprobs = result.logprobs
        for i, request in enumerate(result.sampled):
            if request.is_finished:  # finished or aborted while this step ran: its token is dropped
                continue
            group = self.groups[self.group_id(request)]
            self._append_token(request, group, result.token_ids[i], logprobs[i] if logprobs else None, now)
            touched[group.request_id] = group
        outputs = []
        to_decode = []
        for group in touched.values():
            finished = group.finished
            if finished or not group.final_only:
                outputs.append(group)
            if finished:
                del self.groups[group.request_id]
                if group.detokenizers is None and group.children[0].params.detokenize:
                    to_decode.extend(group.children)
        self._decode_at_end(to_decode)
        return [self.make_output(group) for group in outputs]

    def _add_token_strings(self, result: StepResult) -> None:
        ids: list[int] = []
        if result.logprobs:
            for request, token, entry in zip(result.sampled, result.token_ids, result.logprobs):
                if entry is not None and request.params.logprob_token_strings:
                    ids.append(token)
                    ids.extend(entry[0])
        for request, first_pos, top in result.prompt_logprobs:
            if not request.params.logprob_token_strings:
                continue
            ids.extend(request.prompt_token_ids[first_pos : first_pos + len(top.token_logprobs)])
            for row in top.top_ids:
                ids.extend(row)
        if ids:
            self.token_strings.add(ids)

    def _decode_at_end(self, requests: list[Request]) -> None:
        if not requests:
            return
        skip = requests[0].params.skip_special_tokens
        if self.backend is not None and all(r.params.skip_special_tokens == skip for r in requests):
            texts = self.backend.decode_batch([r.output_token_ids for r in requests], skip_special_tokens=skip)
        else:
            texts = [
                self.tokenizer.decode(r.output_token_ids, skip_special_tokens=r.params.skip_special_tokens)
                for r in requests
            ]
        for request, text in zip(requests, texts):
            request.output_text = text

    def _logprob_dict(
        self, ids: list[int], lps: list[float], token: int, token_lp: float, rank: int, strings: bool = True
    ) -> PositionLogprobs:
        def text(token_id: int) -> str | None:  # strings=False: the caller decodes them (OpenAI server)
            return self.token_strings[token_id] if strings else None

        entry = {token: Logprob(token_lp, rank, text(token))}
        for i, (tid, lp) in enumerate(zip(ids, lps)):
            if tid not in entry:
                entry[tid] = Logprob(lp, i + 1, text(tid))
        return entry

    def _append_prompt_logprobs(self, r: Request, first_pos: int, top: TopLogprobs) -> None:
        for j in range(len(top.token_logprobs)):
            token = r.prompt_token_ids[first_pos + j]
            entry = self._logprob_dict(
                top.top_ids[j],
                top.top_logprobs[j],
                token,
                top.token_logprobs[j],
                top.token_ranks[j],
                r.params.logprob_token_strings,
            )
            r.prompt_logprobs.append(entry)

    def _append_token(
        self, r: Request, group: RequestGroup, token: int, logprobs: SampledLogprobs | None, now: float
    ) -> None:
        r.output_token_ids.append(token)
        self.stats.generation_tokens += 1
        if r.times.first_token is None:
            r.times.first_token = now
        if logprobs is not None:
            ids, lps, token_lp, rank = logprobs
            r.logprobs.append(self._logprob_dict(ids, lps, token, token_lp, rank, r.params.logprob_token_strings))
            r.cumulative_logprob += token_lp
        p = r.params
        new_text = ""
        if group.detokenizers is not None:
            new_text = group.detokenizers[r.group_index].append(token)
            r.output_text += new_text
        status = None
        num_out = len(r.output_token_ids)
        if num_out >= p.min_tokens:
            if not p.ignore_eos and token in r.eos_token_ids:
                status = RequestStatus.FINISHED_STOPPED
            elif token in p.stop_token_ids:
                status, r.stop_reason = RequestStatus.FINISHED_STOPPED, token
            elif p.stop_strings and new_text:
                hit = find_stop_string(r.output_text, len(new_text), p.stop_strings)
                if hit is not None:
                    stop, index = hit
                    r.output_text = r.output_text[: index + (len(stop) if p.include_stop_str_in_output else 0)]
                    status, r.stop_reason = RequestStatus.FINISHED_STOPPED, stop
        if status is None and (num_out >= r.max_tokens or r.num_tokens >= self.max_model_len):
            status = RequestStatus.FINISHED_LENGTH
        if status is not None:
            if group.detokenizers is not None and not isinstance(r.stop_reason, str):  # not cut at a stop string
                r.output_text += group.detokenizers[r.group_index].flush()  # its text ends as decode() ends it
            self.scheduler.finish(r, status)
            t = r.times
            self.stats.record_finished(t.arrival, t.first_scheduled, t.first_token, t.finished, num_out)

    # ---- RequestOutput -------------------------------------------------------------------

    def make_output(self, group: RequestGroup) -> RequestOutput:
        first = group.children[0]
        completions = [self._completion(group, i, c) for i, c in enumerate(group.children)]
        prompt_logprobs = None
        if first.params.prompt_logprobs is not None:
            prompt_logprobs = first.prompt_logprobs[group.sent_prompt_logprobs :]
            if group.delta:
                group.sent_prompt_logprobs = len(first.prompt_logprobs)
        return RequestOutput(
            request_id=group.request_id,
            prompt=group.prompt,
            prompt_token_ids=first.prompt_token_ids,
            prompt_logprobs=prompt_logprobs,
            outputs=completions,
            finished=group.finished,
            delta=group.delta,
            metrics=RequestMetrics(
                arrival_time=first.times.arrival,
                first_scheduled_time=first.times.first_scheduled,
                first_token_time=min(
                    (c.times.first_token for c in group.children if c.times.first_token), default=None
                ),
                finished_time=first.times.finished,
            ),
        )

    @staticmethod
    def _completion(group: RequestGroup, i: int, c: Request) -> CompletionOutput:
        """Child i's output: everything so far, or (DELTA) what is new since the last one, holding back
        the text a stop string may still remove while the child runs."""
        tokens, text, logprobs = (
            c.output_token_ids,
            c.output_text,
            c.logprobs if c.params.logprobs is not None else None,
        )
        if group.delta:
            t0, c0 = group.sent_tokens[i], group.sent_chars[i]
            end = len(text) if c.is_finished else max(c0, len(text) - group.hold_back_chars)
            tokens, text = tokens[t0:], text[c0:end]
            logprobs = logprobs[t0:] if logprobs is not None else None
            group.sent_tokens[i], group.sent_chars[i] = len(c.output_token_ids), end
        else:
            tokens, logprobs = list(tokens), list(logprobs) if logprobs is not None else None
        return CompletionOutput(
            index=i,
            text=text,
            token_ids=tokens,
            cumulative_logprob=c.cumulative_logprob if c.params.logprobs is not None else None,
            logprobs=logprobs,
            finish_reason=c.status.value if c.is_finished else None,
            stop_reason=c.stop_reason,
        )
