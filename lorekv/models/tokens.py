"""Tokenizer helpers shared by the CLI and the evaluation tasks: end-of-turn ids, chat
prompts, and splitting one prompt into a context and a question at a marker."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

SPLIT = "\u0000SPLIT\u0000"
"""Marks where a prompt's context ends and its question begins (never part of a real text)."""

END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|endoftext|>")


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The eos id and every end-of-turn token the vocabulary has, sorted.

    Chat models end an answer with an end-of-turn token that is not always their eos
    (SmolLM2: ``<|im_end|>``; Gemma 3: ``<end_of_turn>``).
    """
    ids = {tokenizer.eos_token_id}
    for token in END_OF_TURN_TOKENS:
        found = tokenizer.convert_tokens_to_ids(token)
        if isinstance(found, int) and found != tokenizer.unk_token_id:
            ids.add(found)
    return sorted(i for i in ids if i is not None)


def chat_text(tokenizer: PreTrainedTokenizerBase, user: str, *, chat: bool = True, plain_suffix: str = "") -> str:
    """One user turn ready for the assistant's answer.

    With ``chat`` and a chat template: the template applied with the generation prompt.
    Otherwise the bare ``user`` text followed by ``plain_suffix``.
    """
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
    return user + plain_suffix


def leading_special_text(tokenizer: PreTrainedTokenizerBase) -> str:
    """The text of the special tokens ``tokenizer(text)`` puts in front of any text (a BOS), or
    ``""``: a prompt built without a chat template and tokenized without special tokens starts
    with them, as the suites' own ``tokenizer(prompt)`` calls do."""
    ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    bare = tokenizer("x", add_special_tokens=False)["input_ids"]
    lead = len(ids) - len(bare) if ids[len(ids) - len(bare) :] == bare else 0
    return tokenizer.decode(ids[:lead]) if lead > 0 else ""


def encode(tokenizer: PreTrainedTokenizerBase, text: str, *, add_special_tokens: bool = False) -> torch.Tensor:
    """(1, n) the ids of ``text`` (with :data:`SPLIT` removed)."""
    return torch.tensor([tokenizer(text.replace(SPLIT, ""), add_special_tokens=add_special_tokens)["input_ids"]])


def encode_split(
    tokenizer: PreTrainedTokenizerBase, text: str, *, add_special_tokens: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """((1, c), (1, q)): ``text`` tokenized once, split at the first token after :data:`SPLIT`.

    The text is tokenized whole (without the marker), so the two parts concatenated are
    exactly :func:`encode` of the same text: no token is merged or split at the boundary.
    """
    if text.count(SPLIT) != 1:
        raise ValueError("text must contain the SPLIT marker exactly once")
    cut = text.index(SPLIT)
    encoded = tokenizer(text.replace(SPLIT, ""), add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    split = next((i for i, (begin, _) in enumerate(offsets) if begin >= cut), len(ids))
    return torch.tensor([ids[:split]]), torch.tensor([ids[split:]])
