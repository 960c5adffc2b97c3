"""The ``"lorekv-text-generation"`` transformers pipeline on a tiny Llama with a word tokenizer
(no chat template: the plain format)."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny_models import tiny_llama, word_tokenizer

import lorekv
from lorekv import Pipeline, decode, generate_full, preset, text_generation
from lorekv.models import encode, encode_split
from lorekv.text_generation import TASK, TextGenerationPipeline

CONTEXT = " ".join(f"w{(7 * i) % 59}" for i in range(40))
QUESTIONS = ["w3 w5 w8", "w13 w21"]
METHOD = {
    "sampler": {"name": "temperature", "num_futures": 2, "num_tokens": 3},
    "scorer": "projected_loo",
    "aggregator": "mean",
    "policy": {"name": "per_head", "budget": 6, "alpha": 0.0},
}


@pytest.fixture(scope="module")
def pipe():
    assert lorekv.register_text_generation() is TextGenerationPipeline
    model, tokenizer = tiny_llama(31, layers=2), word_tokenizer()
    made = transformers.pipeline(TASK, model=model, tokenizer=tokenizer, device="cpu")
    assert isinstance(made, TextGenerationPipeline)
    return made


def expected_ids(tokenizer, question: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain format, split into context and question ids."""
    from lorekv.models import SPLIT

    return encode_split(tokenizer, f"{CONTEXT}{SPLIT}\n\n{question}\nAnswer: ", add_special_tokens=True)


def test_several_questions_from_one_compression(pipe, monkeypatch) -> None:
    compressions, batches = [], []
    original = Pipeline.compress
    monkeypatch.setattr(Pipeline, "compress", lambda self, *a, **k: compressions.append(1) or original(self, *a, **k))
    batch = text_generation.decode_batch
    monkeypatch.setattr(text_generation, "decode_batch", lambda *a, **k: batches.append(a[2].shape) or batch(*a, **k))
    out = pipe(CONTEXT, questions=QUESTIONS, method=METHOD, max_new_tokens=5, eos_token_id=[])
    assert compressions == [1], "one compression for both questions"
    assert len(batches) == 1 and batches[0][0] == 2, "both questions in one generate call, one row each"
    assert set(out) == {"answers", "stats"} and len(out["answers"]) == 2
    assert out["stats"].prompt_tokens == out["stats"].candidate_tokens, "query-agnostic by default"
    model, tokenizer = pipe.model, pipe.tokenizer
    context, _ = expected_ids(tokenizer, QUESTIONS[0])
    compressed = Pipeline.from_config(METHOD).compress(model, context, query_aware=False)
    for question, answer in zip(QUESTIONS, out["answers"], strict=True):
        _, question_ids = expected_ids(tokenizer, question)
        want = decode(model, compressed, question_ids, 5, eos_token_id=[])
        assert answer == want.text(tokenizer) and answer


def test_query_aware_single_question_and_generate_options(pipe) -> None:
    model, tokenizer = pipe.model, pipe.tokenizer
    torch.manual_seed(4)
    out = pipe(CONTEXT, question=QUESTIONS[0], method=METHOD, query_aware=True, max_new_tokens=5, do_sample=True)
    assert set(out) == {"answer", "stats"}
    ids = encode(tokenizer, f"{CONTEXT}\n\n{QUESTIONS[0]}\nAnswer: ", add_special_tokens=True)
    assert out["stats"].prompt_tokens == ids.shape[1] and out["stats"].candidate_tokens == ids.shape[1] - 1
    eos = [tokenizer.eos_token_id]
    compressed = Pipeline.from_config(METHOD).compress(model, ids)
    torch.manual_seed(4)
    assert out["answer"] == decode(model, compressed, None, 5, eos_token_id=eos, do_sample=True).text(tokenizer)
    greedy = pipe(CONTEXT, question=QUESTIONS[0], method=METHOD, query_aware=True, max_new_tokens=5)
    assert greedy["answer"] != out["answer"], "do_sample reached generate"


def test_without_a_method_the_full_cache_answers(pipe) -> None:
    model, tokenizer = pipe.model, pipe.tokenizer
    out = pipe(CONTEXT, question=QUESTIONS[1], max_new_tokens=4)
    context, question = expected_ids(tokenizer, QUESTIONS[1])
    full = generate_full(model, torch.cat([context, question], 1), 4, eos_token_id=[tokenizer.eos_token_id])
    assert out == {"answer": full.text(tokenizer), "stats": None}


def test_a_preset_is_a_method(pipe) -> None:
    out = pipe(CONTEXT, questions=QUESTIONS[:1], method=preset("snapkv", 8, window=4), max_new_tokens=3)
    assert len(out["answers"]) == 1 and out["stats"].kept_fraction < 0.5


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"questions": QUESTIONS, "query_aware": True}, "query_aware"),
        ({"question": "w1", "questions": QUESTIONS}, "not both"),
        ({"questions": "w1 w2"}, "questions"),
        ({"question": "w1", "method": 64}, "method"),
        ({}, "question"),
    ],
)
def test_bad_calls_are_refused(pipe, kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        pipe(CONTEXT, **kwargs)


def test_constructor_keywords_hold_unless_a_call_overrides_them(pipe) -> None:
    """``transformers.pipeline(..., method=...)`` sets the method for every call."""
    made = transformers.pipeline(
        TASK, model=pipe.model, tokenizer=pipe.tokenizer, device="cpu", method=METHOD, max_new_tokens=3
    )
    out = made(CONTEXT, question=QUESTIONS[0])
    assert sum(map(sum, out["stats"].kept)) == 2 * 2 * 6, "the constructor's per-head budget 6"
    assert made(CONTEXT, question=QUESTIONS[0], method=None)["stats"] is None, "a call overrides it"


def test_generate_options_are_refused_before_the_compression(pipe) -> None:
    calls: list[int] = []
    handle = pipe.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError, match="num_beams=2"):
            pipe(CONTEXT, question=QUESTIONS[0], method=METHOD, num_beams=2)
    finally:
        handle.remove()
    assert calls == []


IMPORT_ORDERS = {
    "lorekv first": "import lorekv\n"
    "assert 'transformers' not in sys.modules, 'import lorekv imported transformers'\n"
    "import transformers\n"
    "from tiny_models import tiny_llama, word_tokenizer\n"
    "assert 'lorekv.text_generation' not in sys.modules, 'registered by importing the module, not by the hook'\n",
    "transformers' pipelines first": "import transformers.pipelines\nimport lorekv\n"
    "from tiny_models import tiny_llama, word_tokenizer\n",
}


@pytest.mark.parametrize("order", list(IMPORT_ORDERS))
def test_import_lorekv_makes_the_task_known_to_transformers_pipeline_in_either_order(order: str) -> None:
    """As ``import kvpress`` does for its pipeline, without ``import lorekv`` importing transformers:
    ``transformers.pipeline(TASK, ...)`` builds lorekv's pipeline with no explicit registration."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        + IMPORT_ORDERS[order]
        + "pipe = transformers.pipeline('lorekv-text-generation', model=tiny_llama(31, layers=2),"
        " tokenizer=word_tokenizer(), device='cpu')\n"
        "from lorekv.text_generation import TextGenerationPipeline\n"
        "assert type(pipe) is TextGenerationPipeline, type(pipe)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_failed_registration_warns_with_the_explicit_call_and_leaves_transformers_importable(monkeypatch) -> None:
    from lorekv import autoregister

    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(text_generation, "register", broken)
    with pytest.warns(RuntimeWarning, match=r"boom.*lorekv\.register_text_generation\(\)"):
        autoregister.register_now()


def test_a_decoding_schedule_bounds_the_answers(pipe) -> None:
    """``decoding=`` reaches every path: the same answers as decode with the schedule attached."""
    from lorekv import DecodingSchedule

    model, tokenizer = pipe.model, pipe.tokenizer
    schedule = DecodingSchedule(preset("snapkv", 6, window=2), buffer=3)
    out = pipe(CONTEXT, questions=QUESTIONS, method=preset("snapkv", 6, window=2), max_new_tokens=30,
               eos_token_id=[], decoding=schedule)  # fmt: skip
    context, _ = expected_ids(tokenizer, QUESTIONS[0])
    compressed = Pipeline.from_config(preset("snapkv", 6, window=2)).compress(model, context, query_aware=False)
    for question, answer in zip(QUESTIONS, out["answers"], strict=True):
        _, question_ids = expected_ids(tokenizer, question)
        want = decode(model, compressed, question_ids, 30, eos_token_id=[], decoding=schedule)
        free = decode(model, compressed, question_ids, 30, eos_token_id=[])
        assert answer == want.text(tokenizer) and want.token_ids.tolist() != free.token_ids.tolist()
    full = pipe(CONTEXT, question=QUESTIONS[0], max_new_tokens=30, eos_token_id=[], decoding=schedule.config)
    assert full["answer"] and full["stats"] is None
    with pytest.raises(ValueError, match="decoding must be"):
        pipe(CONTEXT, question=QUESTIONS[0], max_new_tokens=3, decoding="snapkv")
