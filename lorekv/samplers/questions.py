"""Sampled questions: futures that stand for the questions still to come (query-agnostic use).

When a context is compressed before its question is known, futures that merely continue the
context (the temperature sampler's) attend like the context's own last tokens, so they keep
what a prompt window keeps. The Monte Carlo view asks for the continuations the model would
write *when asked about this context*; the model itself can pose those questions. After the
context, the sampler feeds a fixed script and lets each of M futures draw its own question and
answer:

    context | instruction + suffix + question_prefix | question (T_q drawn) | answer_prefix |
    answer (T_a drawn)

(positions n, n+1, ...: the instruction right after the context, the futures' tokens after
it). ``suffix`` closes the user turn and opens the answer with the tokenizer's chat template
(``"\\n"`` for a base model without one), as :mod:`lorekv.samplers.kvzip` does. The fed text
(instruction, prefixes) is never a prompt token: it is not a candidate, not kept, not counted in
the budget, and its KV goes with the futures'. Its keys do sit in the drawn tokens' softmax, as
they did when the model drew them.

The queries scored (``queries``): the answer side, the question side or both, each side being
the queries that produced its drawn tokens (the last fed token's before it, which draws the
first token, as the prompt's last query draws the first answer token query-aware, and those of
its first T - 1 tokens) and the query of its last token: T + 1 queries a side. The futures' token
statistics are the drawn tokens' of the sides scored, so a log-prob or reliability aggregator
weighs a future by its own question or answer, not by the fixed text.

Related: KVzip (https://arxiv.org/abs/2505.23416) repeats the context instead; kvpress's
query-agnostic protocol compresses a context once for several questions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import torch
from pydantic import Field

from lorekv import token_rules
from lorekv.samplers.base import (
    SAMPLERS,
    Rollout,
    Sampler,
    SamplerConfig,
    assistant_suffix,
    encode,
    required_tokenizer,
)
from lorekv.token_rules import Draws, TokenRule
from lorekv.trajectories import Drawn, Fed, Trajectories

Side = Literal["answer", "question", "both"]


class QuestionsConfig(SamplerConfig):
    """Config of :class:`QuestionsSampler`.

    Attributes:
        num_futures: M, sampled question+answer futures (>= 1).
        question_tokens: T_q, tokens each future draws for its question (>= 1).
        answer_tokens: T_a, tokens each future draws for its answer (>= 1).
        temperature: softmax temperature of the draws (finite, > 0; 1: the model's own).
        top_p: nucleus mass of the draws in (0, 1]; 1 (default) is plain temperature sampling.
        seed: seeds the draws afresh on every call: same prompt and config, same futures.
        draws: ``independent`` (default) or ``stratified`` across the M futures at each step,
            as the ``temperature`` sampler's ``draws``.
        queries: which queries are scored: ``"answer"`` (default), ``"question"`` or ``"both"``.
        instruction: text fed right after the context, asking for a question and its answer.
        suffix: text between the instruction and the question; None (default): the tokenizer's
            chat template's assistant header, or "\\n" without a chat template (base models).
        question_prefix: text that opens the question (fed).
        answer_prefix: text fed between the question and the answer.

    The text is tokenized at run time with the tokenizer passed to ``Pipeline.compress`` /
    ``Pipeline.generate`` (``tokenizer=``).
    """

    name: Literal["questions"] = "questions"
    num_futures: int = Field(default=4, ge=1, strict=True)
    question_tokens: int = Field(default=16, ge=1, strict=True)
    answer_tokens: int = Field(default=8, ge=1, strict=True)
    temperature: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int = Field(default=0, strict=True)
    draws: Draws = "independent"
    queries: Side = "answer"
    instruction: str = "\n\nAsk one short question about a specific detail of the text above, then answer it."
    suffix: str | None = None
    question_prefix: str = "Question:"
    answer_prefix: str = "\nAnswer:"


@SAMPLERS.register(QuestionsConfig)
class QuestionsSampler(Sampler):
    """M futures, each a drawn question and answer after a fed instruction (queries of one or
    both sides)."""

    config: QuestionsConfig

    def texts(self, tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The fed ids: (k,) the head (instruction + suffix + question prefix) and (c,) the
        answer prefix."""
        cfg = self.config
        head = cfg.instruction + assistant_suffix(tokenizer, cfg.suffix) + cfg.question_prefix
        return encode(tokenizer, head), encode(tokenizer, cfg.answer_prefix)

    def rule(self, generator: torch.Generator) -> TokenRule:
        """Temperature (``top_p`` 1) or nucleus sampling, drawing from ``generator``."""
        cfg = self.config
        if cfg.top_p == 1.0:
            return lambda logits: token_rules.temperature(logits, cfg.temperature, generator, cfg.draws)
        return lambda logits: token_rules.nucleus(logits, cfg.temperature, cfg.top_p, generator, cfg.draws)

    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        """k + T_q + c + T_a: the fed text and the drawn tokens."""
        head, cue = self.texts(required_tokenizer(tokenizer, self.config.name))
        return head.numel() + self.config.question_tokens + cue.numel() + self.config.answer_tokens

    def sides(self, head: int, cue: int) -> tuple[list[int], list[int]]:
        """(query indices, token indices) along the script of the sides scored, in order.

        The question's tokens are script indices [head, head + T_q), the answer's
        [head + T_q + cue, ... + T_a); a side's queries start one index earlier (the query that
        drew its first token; ``head`` >= 1 is needed for the question's, else the prompt's
        last query draws it and the side starts at its first token).
        """
        cfg = self.config
        spans = []
        if cfg.queries in ("question", "both"):
            spans.append((head, cfg.question_tokens))
        if cfg.queries in ("answer", "both"):
            spans.append((head + cfg.question_tokens + cue, cfg.answer_tokens))
        queries: list[int] = []
        tokens: list[int] = []
        for first, length in spans:
            tokens.extend(range(first, first + length))
            queries.extend(i for i in range(max(first - 1, 0), first + length) if i not in queries)
        return queries, tokens

    def sample(self, rollout: Rollout) -> Trajectories:
        """Futures (M, T_side): the sides' drawn tokens; queries (M, H, T_side + sides, d) at their
        script positions (n + index), response keys every fed and drawn token (M, G, S, d)."""
        cfg = self.config
        head, cue = self.texts(required_tokenizer(getattr(rollout, "tokenizer", None), cfg.name))
        rule = self.rule(rollout.generator(cfg.seed))
        script = [Fed(head), Drawn(rule, cfg.question_tokens), Fed(cue), Drawn(rule, cfg.answer_tokens)]
        full = rollout.follow(script, cfg.num_futures)
        total = head.numel() + cfg.question_tokens + cue.numel() + cfg.answer_tokens
        if full.token_ids.shape != (cfg.num_futures, total):
            got = tuple(full.token_ids.shape)
            raise ValueError(f"rollout returned futures of shape {got}, expected ({cfg.num_futures}, {total})")
        queries, tokens = self.sides(head.numel(), cue.numel())
        device = full.token_ids.device
        keep = torch.tensor(tokens, device=device)
        layers = []
        for layer in full.layers:
            index = torch.tensor(queries, device=layer.queries.device)
            layers.append(
                replace(
                    layer,
                    queries=layer.queries.index_select(2, index),
                    query_positions=layer.query_positions.index_select(0, index.to(layer.query_positions.device)),
                    query_norms=None
                    if layer.query_norms is None
                    else layer.query_norms.index_select(1, index.to(layer.query_norms.device)),
                    lse=None if layer.lse is None else layer.lse.index_select(2, index.to(layer.lse.device)),
                )
            )
        return Trajectories(
            token_ids=full.token_ids.index_select(1, keep),
            logprobs=full.logprobs.index_select(1, keep.to(full.logprobs.device)),
            entropies=full.entropies.index_select(1, keep.to(full.entropies.device)),
            layers=tuple(layers),
            prompt_length=full.prompt_length,
        )
