"""Text in, text out: the ``"lorekv-text-generation"`` transformers pipeline.

After ``import lorekv``::

    pipe = transformers.pipeline("lorekv-text-generation", model=model, tokenizer=tokenizer)
    pipe(context, question="...", method=preset("lore_kv", 64), max_new_tokens=32)
    pipe(context, questions=["...", "..."], method=preset("lore_kv", 64))  # one compression

``import lorekv`` registers it as soon as transformers' pipelines load (:mod:`lorekv.autoregister`:
importing lorekv or one of its component families must not import transformers, which the
families are tested without), and importing this module registers it; :func:`register` is the
explicit call.

This module is the one place above the binding that imports transformers: a transformers
``Pipeline`` subclass that builds a lorekv :class:`~lorekv.pipeline.Pipeline` needs both.
Answers are decoded by ``model.generate`` on forks of the compressed cache
(:func:`lorekv.hf.decoding.decode`; several questions in one batched call, each row a copy of the
compressed context: :func:`lorekv.hf.decoding.decode_batch`), so every generate option passes
through. Batched, k questions hold k copies of the compressed KV while they decode, and sampled
answers (``do_sample=True``) are one call's draws, not those of k calls with the same seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from transformers import Pipeline as TransformersPipeline
from transformers.pipelines import PIPELINE_REGISTRY

from lorekv.hf import CompressedCache, check_generate_options, decode, decode_batch, generate_full, left_pad
from lorekv.models import SPLIT, chat_text, encode, encode_split, end_of_turn_ids
from lorekv.pipeline import Pipeline, PipelineConfig
from lorekv.schedule import DecodingSchedule, ScheduleConfig

TASK = "lorekv-text-generation"


class TextGenerationPipeline(TransformersPipeline):
    """Answer questions about a long context from one compressed cache.

    Call it as ``pipe(context, question=..., method=...)`` (returns ``{"answer", "stats"}``) or
    ``pipe(context, questions=[...], method=...)`` (returns ``{"answers", "stats"}``).

    Keyword arguments of a call:
        question / questions: one question, or several answered from the same compression.
        method: the eviction method: a lorekv ``Pipeline``, a ``PipelineConfig`` (e.g.
            ``preset("lore_kv", 64)``), its mapping or a YAML/JSON path; None keeps the full cache.
        query_aware: compress the context together with its single question (the question's
            tokens are part of the prompt the method scores). Default False: query-agnostic, the
            context alone is compressed and every question is fed after it, because one
            compression then serves every question, and it is what kvpress's pipeline does by
            default, so the two are compared on the same footing. A method's ``agnostic_``
            parts then compress (``lore_kv``'s: KVzip's reconstruction, scorer and global
            threshold; the pipeline hands the sampler its tokenizer).
        answer_prefix: text the answer starts with (fed after the generation prompt).
        chat: wrap the text in the tokenizer's chat template (default: if it has one); otherwise
            the plain format ``context + "\\n\\n" + question + "\\nAnswer: "``.
        max_new_tokens: answer length bound (default 32).
        decoding: a :class:`~lorekv.schedule.DecodingSchedule` (or its ``ScheduleConfig``) that
            keeps the cache within its budget while the answer is generated: compression while
            generating, on the compressed context or (``method=None``) the whole prompt.
        any other keyword: a ``model.generate`` option (``do_sample=True``, ``temperature``,
            ``eos_token_id``, a ``streamer``, ...). Decoding is greedy by default and stops at
            the tokenizer's end-of-turn tokens unless ``eos_token_id`` says otherwise.

    The stats are the :class:`~lorekv.hf.compressed.CompressionStats` of the compression (None
    with the full cache).
    """

    PREPROCESS = ("query_aware", "answer_prefix", "chat")
    FORWARD = ("method", "query_aware", "max_new_tokens", "decoding")

    def _sanitize_parameters(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Split a call's (or the constructor's) keywords; only those given are returned, so that
        transformers merges them over the constructor's (``pipeline(..., method=...)`` holds)."""
        preprocess: dict[str, Any] = {}
        forward: dict[str, Any] = {}
        postprocess: dict[str, Any] = {}
        question, questions = kwargs.pop("question", None), kwargs.pop("questions", None)
        if question is not None or questions is not None:
            if question is not None and questions is not None:
                raise ValueError("give question or questions, not both")
            if questions is not None and (
                isinstance(questions, str) or not questions or not all(isinstance(q, str) for q in questions)
            ):
                raise ValueError(f"questions must be a non-empty list of strings, got {questions!r}")
            preprocess["questions"] = [question] if question is not None else list(questions)
            postprocess["single"] = question is not None
        if "query_aware" in kwargs and not isinstance(kwargs["query_aware"], bool):
            raise ValueError(f"query_aware must be True or False, got {kwargs['query_aware']!r}")
        preprocess.update({key: kwargs[key] for key in self.PREPROCESS if key in kwargs})
        forward.update({key: kwargs[key] for key in self.FORWARD if key in kwargs})
        generate = {key: value for key, value in kwargs.items() if key not in (*self.PREPROCESS, *self.FORWARD)}
        if generate:
            check_generate_options(self.model, {k: v for k, v in generate.items() if k != "eos_token_id"})
        forward.update(generate)
        return preprocess, forward, postprocess

    def preprocess(
        self,
        context: str,
        questions: list[str] | None = None,
        query_aware: bool = False,
        answer_prefix: str = "",
        chat: bool | None = None,
    ) -> dict[str, Any]:
        """Token ids: ``context`` (1, c) and one (1, q) per question; query-aware, the whole prompt."""
        if not isinstance(context, str):
            raise ValueError(f"context must be a string, got {type(context).__name__}")
        if questions is None:
            raise ValueError("give question='...' or questions=[...]")
        if query_aware and len(questions) != 1:
            raise ValueError(
                f"query_aware=True compresses the context with its question: give one question, got {len(questions)}"
            )
        tokenizer = self.tokenizer
        chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
        texts = [
            chat_text(tokenizer, f"{context}{SPLIT}\n\n{q}", chat=chat, plain_suffix="\nAnswer: ") + answer_prefix
            for q in questions
        ]
        special = not chat
        if query_aware:
            return {"prompt_ids": encode(tokenizer, texts[0], add_special_tokens=special)}
        context_ids, question_ids = None, []
        for i, text in enumerate(texts):
            head, tail = encode_split(tokenizer, text, add_special_tokens=special)
            if context_ids is None:
                context_ids = head
            elif not torch.equal(head, context_ids):
                raise ValueError(f"question {i} changes how the end of the context tokenizes; start it with a space")
            question_ids.append(tail)
        return {"context_ids": context_ids, "question_ids": question_ids}

    def _forward(
        self,
        inputs: dict[str, Any],
        method: Any = None,
        query_aware: bool = False,
        max_new_tokens: int = 32,
        decoding: Any = None,
        **options: Any,
    ) -> dict[str, Any]:
        eos = options.pop("eos_token_id") if "eos_token_id" in options else end_of_turn_ids(self.tokenizer)
        model = self.model
        pipeline = as_pipeline(method)
        options["decoding"] = as_schedule(decoding)
        if query_aware:
            ids = inputs["prompt_ids"]
            if pipeline is None:
                answers = [generate_full(model, ids, max_new_tokens, eos_token_id=eos, **options)]
                return {"generations": answers, "stats": None}
            compressed = pipeline.compress(model, ids, tokenizer=self.tokenizer, answer_tokens=max_new_tokens)
            answers = [decode(model, compressed, None, max_new_tokens, eos_token_id=eos, **options)]
            return {"generations": answers, "stats": compressed.stats}
        context, questions = inputs["context_ids"], inputs["question_ids"]
        if pipeline is None:
            answers = [
                generate_full(model, torch.cat([context, q], 1), max_new_tokens, eos_token_id=eos, **options)
                for q in questions
            ]
            return {"generations": answers, "stats": None}
        longest = max(q.shape[1] for q in questions)
        compressed: CompressedCache = pipeline.compress(
            model, context, query_aware=False, tokenizer=self.tokenizer, answer_tokens=longest + max_new_tokens
        )
        if len(questions) == 1 or "streamer" in options:  # transformers' streamers take one row
            answers = [decode(model, compressed, q, max_new_tokens, eos_token_id=eos, **options) for q in questions]
        else:  # every question in one generate call, each on its own copy of the compressed context
            ids, mask = left_pad(questions)
            rows = compressed.rows([0] * len(questions))
            answers = decode_batch(model, rows, ids, mask, max_new_tokens, eos_token_id=eos, **options)
        return {"generations": answers, "stats": compressed.stats}

    def postprocess(self, outputs: dict[str, Any], single: bool = True) -> dict[str, Any]:
        texts = [g.text(self.tokenizer) for g in outputs["generations"]]
        if single:
            return {"answer": texts[0], "stats": outputs["stats"]}
        return {"answers": texts, "stats": outputs["stats"]}


def as_pipeline(method: Any) -> Pipeline | None:
    """A lorekv :class:`Pipeline` from ``method``: a Pipeline, a PipelineConfig, its mapping or a
    YAML/JSON path; None stays None (the full cache)."""
    if method is None or isinstance(method, Pipeline):
        return method
    if isinstance(method, (PipelineConfig, Mapping, str, Path)):
        return Pipeline.from_config(method)
    raise ValueError(
        f"method must be a lorekv Pipeline, a PipelineConfig (e.g. preset('lore_kv', 64)), its mapping, "
        f"a YAML/JSON path or None (the full cache), got {type(method).__name__}"
    )


def as_schedule(decoding: Any) -> DecodingSchedule | None:
    """A :class:`DecodingSchedule` from ``decoding``: a schedule, its ``ScheduleConfig`` or its
    mapping; None stays None (the cache grows with the answer)."""
    if decoding is None or isinstance(decoding, DecodingSchedule):
        return decoding
    if isinstance(decoding, (ScheduleConfig, Mapping)):
        return DecodingSchedule.from_config(decoding)
    raise ValueError(
        f"decoding must be a lorekv DecodingSchedule, a ScheduleConfig, its mapping or None, got "
        f"{type(decoding).__name__}"
    )


def register() -> type[TextGenerationPipeline]:
    """Register ``"lorekv-text-generation"`` with ``transformers.pipeline`` (idempotent)."""
    if PIPELINE_REGISTRY.supported_tasks.get(TASK, {}).get("impl") is not TextGenerationPipeline:
        PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=TextGenerationPipeline, pt_model=AutoModelForCausalLM)
    return TextGenerationPipeline


register_text_generation = register
"""The name ``lorekv`` exports: ``lorekv.register_text_generation()``."""

register()

__all__ = ["TASK", "TextGenerationPipeline", "as_pipeline", "as_schedule", "register", "register_text_generation"]
