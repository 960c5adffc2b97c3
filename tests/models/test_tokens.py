"""Tokenizer helpers on a tiny word-level tokenizer built in the test (no downloads)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lorekv.models.tokens import SPLIT, chat_text, encode, encode_split, end_of_turn_ids

WORDS = ["<unk>", "<|im_end|>", "<eos>", "the", "needle", "is", "42", "what", "?", "."]


@pytest.fixture
def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")


def test_encode_split_concatenates_to_the_whole_prompt(tokenizer) -> None:
    text = f"the needle is 42 .{SPLIT} what is the needle ?"
    context, question = encode_split(tokenizer, text)
    whole = encode(tokenizer, text)
    assert torch.equal(torch.cat([context, question], dim=1), whole)
    assert context.tolist() == [[3, 4, 5, 6, 9]]
    assert question.tolist() == [[7, 5, 3, 4, 8]]


def test_encode_split_needs_exactly_one_marker(tokenizer) -> None:
    with pytest.raises(ValueError, match="SPLIT"):
        encode_split(tokenizer, "the needle")
    with pytest.raises(ValueError, match="SPLIT"):
        encode_split(tokenizer, f"the{SPLIT}needle{SPLIT}")


def test_end_of_turn_ids_take_eos_and_known_end_tokens(tokenizer) -> None:
    assert end_of_turn_ids(tokenizer) == [1, 2]


def test_chat_text_without_template_appends_the_plain_suffix(tokenizer) -> None:
    assert chat_text(tokenizer, "the needle", plain_suffix="\nAnswer: ") == "the needle\nAnswer: "
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.content }}>{% endfor %}{% if add_generation_prompt %}!{% endif %}"
    )
    assert chat_text(tokenizer, "the needle") == "<the needle>!"
    assert chat_text(tokenizer, "the needle", chat=False, plain_suffix="?") == "the needle?"
