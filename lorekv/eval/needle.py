"""Needle-in-a-haystack prompts built from prose that ships with Python (``pydoc_data``).

A needle ("The special magic number for <key> is <value>.") is placed at a chosen depth in a
haystack of real English sentences from the Python reference manual, and the model is asked
for the value. The answer is correct when the value appears in the decoded text. Everything
is drawn from a seeded generator, so a task is reproducible from (seed, length, depth) on
one Python build; ``pydoc_data`` differs between builds (pyenv and Debian's 3.11 ship
different text), and so do the prompts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache
from pydoc_data.topics import topics
from typing import TYPE_CHECKING

import torch

from lorekv.models.tokens import SPLIT, chat_text, encode, encode_split

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

KEYS = (
    "amber", "basalt", "cobalt", "dune", "ember", "fjord", "glacier", "harbor", "indigo", "juniper",
    "kestrel", "lagoon", "meadow", "nebula", "orchid", "prairie", "quartz", "raven", "sierra", "tundra",
)  # fmt: skip


@dataclass(frozen=True)
class NeedleTask:
    """One needle question.

    Attributes:
        context: the haystack with the needle inside.
        question: what the model is asked about the needle.
        answer_prefix: the start of the assistant's turn, part of the prompt (RULER's
            template does the same), so that the answer proper starts with the value.
        answer: the value that must appear in the model's answer.
        depth: where the needle sits, as a fraction of the haystack's sentences.
    """

    context: str
    question: str
    answer_prefix: str
    answer: str
    depth: float

    def is_correct(self, text: str) -> bool:
        return self.answer in text


@cache
def haystack_sentences() -> tuple[str, ...]:
    """Prose sentences of the Python reference manual (code, grammar and tables left out)."""
    sentences: list[str] = []
    for key in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[key]):
            lines = paragraph.splitlines()
            if not lines or any(line.startswith((" ", "\t")) for line in lines):
                continue
            text = " ".join(line.strip() for line in lines)
            if len(text) < 80 or re.search(r"[*=`|]{2}|::=|\*\*\*", text):
                continue
            for sentence in re.split(r"(?<=[.!?])\s+", text):
                letters = sum(ch.isalpha() or ch == " " for ch in sentence)
                if len(sentence) >= 40 and sentence[0].isupper() and letters / len(sentence) > 0.85:
                    sentences.append(sentence)
    return tuple(sentences)


def check_task(num_tokens: int, depth: float = 0.5) -> None:
    """The arguments of :func:`make_task`, checked without a tokenizer (before loading a model)."""
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth!r}")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 64:
        raise ValueError(f"tokens (the haystack length) must be an integer >= 64, got {num_tokens!r}")


def make_task(
    tokenizer: PreTrainedTokenizerBase, num_tokens: int = 1500, depth: float = 0.5, seed: int = 0
) -> NeedleTask:
    """A haystack of about ``num_tokens`` tokens with one needle at ``depth`` in [0, 1]."""
    check_task(num_tokens, depth)
    rng = random.Random(seed)
    key = rng.choice(KEYS)
    value = str(rng.randint(1_000_000, 9_999_999))
    needle = f"The special magic number for {key} is {value}."
    pool = haystack_sentences()
    start = rng.randrange(len(pool))
    chosen: list[str] = []
    used = len(tokenizer(needle, add_special_tokens=False)["input_ids"])
    while used < num_tokens:
        sentence = pool[(start + len(chosen)) % len(pool)]
        chosen.append(sentence)
        used += len(tokenizer(" " + sentence, add_special_tokens=False)["input_ids"])
    chosen.insert(round(depth * len(chosen)), needle)
    question = f"What is the special magic number for {key} mentioned in the text above?"
    prefix = f"The special magic number for {key} mentioned in the text is"
    return NeedleTask(" ".join(chosen), question, prefix, value, depth)


def prompt_text(tokenizer: PreTrainedTokenizerBase, task: NeedleTask) -> str:
    """The chat prompt of ``task``, answer prefix included, with :data:`SPLIT` where the context ends."""
    user = f"{task.context}{SPLIT}\n\n{task.question}"
    return chat_text(tokenizer, user, plain_suffix="\nAnswer: ") + task.answer_prefix


def prompt_ids(tokenizer: PreTrainedTokenizerBase, task: NeedleTask) -> torch.Tensor:
    """(1, n) the whole chat prompt, question included (query-aware use)."""
    return encode(tokenizer, prompt_text(tokenizer, task))


def context_and_question_ids(tokenizer: PreTrainedTokenizerBase, task: NeedleTask) -> tuple[torch.Tensor, torch.Tensor]:
    """((1, c), (1, q)): the prompt split where the context ends (query-agnostic use).

    Concatenated, they are exactly :func:`prompt_ids`.
    """
    return encode_split(tokenizer, prompt_text(tokenizer, task))
