"""Benchmark files: each format's rows, the prompts against the suite's template, middle
truncation as LongBench defines it, subsets, and a one-line error naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorekv.eval.suites.metrics import metric
from lorekv.eval.suites.record import FORMATS
from lorekv.eval.suites.task import FileTaskConfig, load, truncate_middle
from lorekv.models.tokens import SPLIT

FIXTURES = Path(__file__).parent / "fixtures"

HOTPOTQA = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give "
    "me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
)
TREC = "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}"
V2 = (
    "Please read the following text and answer the question below.\n\n<text>\n{doc}\n</text>\n\nWhat is the correct "
    "answer to this question: {q}\nChoices:\n(A) {a}\n(B) {b}\n(C) {c}\n(D) {d}\n\nFormat your response as follows: "
    '"The correct answer is (insert answer here)".'
)
"""The suites' templates, written out (LongBench config/dataset2prompt.json, LongBench v2 prompts/0shot.txt)."""


def rows(path: Path) -> list[dict]:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def task(**options) -> FileTaskConfig:
    return FileTaskConfig.model_validate({"name": "file", **options})


def chat(tokenizer, user: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )


def test_longbench_prompts_are_its_templates_with_its_chat_rule(smollm2_tokenizer) -> None:
    config = task(format="longbench", path=str(FIXTURES / "longbench"))
    questions = load(config)
    assert [q.record.subtask for q in questions] == ["hotpotqa", "hotpotqa", "passage_count", "trec"]
    hotpot = rows(FIXTURES / "longbench" / "hotpotqa.jsonl")[0]
    sample = config.sample(smollm2_tokenizer, 4096, 0, seed=0)
    assert sample.task == "longbench/hotpotqa" and sample.suite == "LongBench"
    assert sample.metric == "qa_f1" and sample.max_new_tokens == 32 and sample.answers == ("1888",)
    text = sample.prompt_text(smollm2_tokenizer)
    assert text.replace(SPLIT, "") == chat(smollm2_tokenizer, HOTPOTQA.format(**hotpot))
    assert text.index(SPLIT) == text.index(hotpot["context"]) + len(hotpot["context"])
    trec = rows(FIXTURES / "longbench" / "trec.jsonl")[0]
    sample = config.sample(smollm2_tokenizer, 4096, 3, seed=0)
    assert sample.metric == "classification:first_line" and sample.classes == tuple(trec["all_classes"])
    assert sample.prompt_text(smollm2_tokenizer).replace(SPLIT, "") == TREC.format(**trec), "trec: no chat template"
    assert config.sample(smollm2_tokenizer, 4096, 2, seed=0).answers == ("2",)


def test_longbench_e_rows_are_tagged_with_their_length_group() -> None:
    questions = load(task(format="longbench", path=str(FIXTURES / "longbench_e")))
    assert [q.record.subtask for q in questions] == ["hotpotqa_e"] * 2
    assert [dict(q.record.tags) for q in questions] == [{"length": "0-4k"}, {"length": "4-8k"}]


def test_middle_truncation_keeps_the_head_and_tail_halves_as_longbench_does(smollm2_tokenizer) -> None:
    config = task(format="longbench", path=str(FIXTURES / "longbench"), subtasks=["hotpotqa"])
    row = rows(FIXTURES / "longbench" / "hotpotqa.jsonl")[1]
    whole = HOTPOTQA.format(**row)
    ids = smollm2_tokenizer(whole)["input_ids"]
    limit = len(ids) - 20
    sample = config.sample(smollm2_tokenizer, limit, 1, seed=0)
    half = limit // 2
    expected = smollm2_tokenizer.decode(ids[:half]) + smollm2_tokenizer.decode(ids[-half:])
    assert sample.context + sample.separator + sample.question == expected
    assert len(smollm2_tokenizer(expected)["input_ids"]) <= limit < len(ids)
    assert truncate_middle(smollm2_tokenizer, whole, len(ids)) == whole, "a prompt within the limit is untouched"


def test_a_question_that_does_not_fit_after_truncation_names_the_row(smollm2_tokenizer) -> None:
    config = task(format="longbench", path=str(FIXTURES / "longbench"), subtasks=["hotpotqa"])
    with pytest.raises(ValueError, match=r"hotpotqa\.jsonl:1: the question does not fit in the last 10 tokens"):
        config.sample(smollm2_tokenizer, 20, 0, seed=0)


def test_longbench_v2_prompt_answer_and_tags(smollm2_tokenizer) -> None:
    config = task(format="longbench_v2", path=str(FIXTURES / "longbench_v2" / "data.json"))
    row = rows(FIXTURES / "longbench_v2" / "data.json")[1]
    sample = config.sample(smollm2_tokenizer, 4096, 1, seed=0)
    filled = V2.format(
        doc=row["context"],
        q=row["question"],
        a=row["choice_A"],
        b=row["choice_B"],
        c=row["choice_C"],
        d=row["choice_D"],
    )
    assert sample.prompt_text(smollm2_tokenizer).replace(SPLIT, "") == chat(smollm2_tokenizer, filled)
    assert sample.answers == ("C",) and sample.metric == "choice" and sample.max_new_tokens == 128
    assert dict(sample.tags) == {"domain": "Single-Document QA", "difficulty": "hard", "length": "medium"}


def test_ruler_files_feed_input_and_answer_prefix_as_written(smollm2_tokenizer) -> None:
    config = task(format="ruler", path=str(FIXTURES / "ruler"))
    questions = load(config)
    assert [q.record.subtask for q in questions] == ["niah_single_1", "qa_1"]
    for index, name in enumerate(["niah_single_1", "qa_1"]):
        row = rows(FIXTURES / "ruler" / name / "validation.jsonl")[0]
        sample = config.sample(smollm2_tokenizer, 4096, index, seed=0)
        assert sample.prompt_text(smollm2_tokenizer).replace(SPLIT, "") == row["input"] + row["answer_prefix"]
        assert sample.answers == tuple(row["outputs"])
    niah, qa = (config.sample(smollm2_tokenizer, 4096, i, seed=0) for i in range(2))
    assert (niah.metric, niah.max_new_tokens, qa.metric, qa.max_new_tokens) == ("all", 128, "part", 32)
    assert niah.question.startswith("\nWhat are all the special magic numbers for quiet-harbor")


def test_ruler_does_not_truncate(smollm2_tokenizer) -> None:
    config = task(format="ruler", path=str(FIXTURES / "ruler"), subtasks=["niah_single_1"])
    with pytest.raises(ValueError, match=r"validation\.jsonl:1: the prompt has \d+ tokens, over the length 64"):
        config.sample(smollm2_tokenizer, 64, 0, seed=0)


def test_unified_rows_are_one_chat_turn_like_kvpress(smollm2_tokenizer) -> None:
    config = task(format="ruler_unified", path=str(FIXTURES / "ruler_unified"))
    row = rows(FIXTURES / "ruler_unified" / "ruler_4096.jsonl")[1]
    sample = config.sample(smollm2_tokenizer, 4096, 1, seed=0)
    expected = chat(smollm2_tokenizer, row["context"] + row["question"]) + row["answer_prefix"]
    assert sample.prompt_text(smollm2_tokenizer).replace(SPLIT, "") == expected
    assert (sample.task, sample.metric, sample.max_new_tokens) == ("ruler_unified/qa_1", "part", 32)


def test_generic_rows_carry_their_metric_and_answer_length() -> None:
    questions = load(task(format="jsonl", path=str(FIXTURES / "jsonl")))
    metrics = [(q.record.metric, q.record.max_new_tokens, q.record.turns[0].answers) for q in questions]
    assert metrics == [("part", 64, ("red",)), ("all", 64, ("3200",)), ("part", 16, ("ferry office",))]
    config = task(format="jsonl", path=str(FIXTURES / "jsonl"), metric="qa_f1", title="notes")
    sample = config.sample(_Words(), 512, 1, seed=0)
    assert (sample.task, sample.metric, sample.answers) == ("notes/notes", "qa_f1", ("3200",)), "metric replaces"


class _Words:
    """Whitespace tokens (enough of the tokenizer interface for a sample that needs no truncation)."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": list(range(len(text.split())))}

    def decode(self, ids: list[int]) -> str:
        return ""


def test_subsets_limit_per_subtask_and_draw_by_seed_in_file_order() -> None:
    path = str(FIXTURES / "jsonl")
    all_rows = load(task(format="jsonl", path=path))
    assert len(load(task(format="jsonl", path=path, limit=2))) == 2
    drawn = [load(task(format="jsonl", path=path, limit=2, seed=s)) for s in range(6)]
    for picked in drawn:
        positions = [all_rows.index(q) for q in picked]
        assert positions == sorted(positions) and len(set(positions)) == 2
    assert len({tuple(all_rows.index(q) for q in p) for p in drawn}) > 1, "the seed changes the subset"
    assert drawn[0] == load(task(format="jsonl", path=path, limit=2, seed=0)), "the same seed, the same subset"
    lb = load(task(format="longbench", path=str(FIXTURES / "longbench"), limit=1))
    assert [q.record.subtask for q in lb] == ["hotpotqa", "passage_count", "trec"], "limit is per sub-task"


def test_hub_route_reads_through_datasets(tmp_path) -> None:
    pytest.importorskip("datasets")
    local = task(format="longbench", path=str(FIXTURES / "longbench" / "hotpotqa.jsonl"))
    hub = task(format="longbench", hub="json", data_files=str(FIXTURES / "longbench" / "hotpotqa.jsonl"), split="train")
    assert [q.record for q in load(hub)] == [q.record for q in load(local)]


@pytest.mark.parametrize(
    ("content", "options", "message"),
    [
        ('{"input": "q", "answers": ["a"], "dataset": "hotpotqa"}\n', {}, r"bad\.jsonl:1: missing field 'context'"),
        (
            '{"input": "q", "context": "c", "answers": ["a"], "dataset": "hotpotqa"}\n'
            '{"input": "q", "context": "c", "answers": [], "dataset": "hotpotqa"}\n',
            {},
            r"bad\.jsonl:2: field 'answers' is empty",
        ),
        (
            '{"input": "q", "context": "c", "answers": ["a"], "dataset": "hotpot"}\n',
            {},
            r"bad\.jsonl:1: unknown LongBench dataset 'hotpot'",
        ),
        (
            '{"input": "q", "context": "c", "answers": ["a"], "dataset": "trec"}\n',
            {},
            r"bad\.jsonl:1: .*needs 'all_classes'",
        ),
        ("{not json\n", {}, r"bad\.jsonl:1: not valid JSON"),
        (
            '{"input": "q", "context": "c", "answers": ["a"], "dataset": "hotpotqa"}\n',
            {"subtasks": ["qasper"]},
            r"no row of sub-task 'qasper'",
        ),
    ],
)
def test_bad_rows_fail_in_one_line_naming_the_file_and_line(tmp_path, content, options, message) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load(task(format="longbench", path=str(path), **options))


def test_bad_options_fail_before_reading() -> None:
    with pytest.raises(ValueError, match="format: unknown 'longbenchh'"):
        task(format="longbenchh", path="x")
    with pytest.raises(ValueError, match="unknown sub-task 'hotpot'"):
        task(format="longbench", path="x", subtasks=["hotpot"])
    with pytest.raises(ValueError, match="give exactly one of path"):
        task(format="longbench")
    with pytest.raises(ValueError, match="seed draws a subset of limit rows"):
        task(format="jsonl", path="x", seed=1)
    with pytest.raises(ValueError, match="no such file or folder"):
        load(task(format="jsonl", path="/nonexistent/data.jsonl"))
    with pytest.raises(ValueError, match="missing field 'context'"):
        load(task(format="longbench", path=str(FIXTURES / "ruler")))


FIXTURE_OF = {
    "longbench": "longbench",
    "longbench_v2": "longbench_v2",
    "ruler": "ruler",
    "ruler_unified": "ruler_unified",
    "jsonl": "jsonl",
    "infinitebench": "infinitebench",
    "loogle": "loogle",
    "scbench": "scbench",
}


@pytest.mark.parametrize("fmt", sorted(FIXTURE_OF))
def test_every_format_reads_its_fixture_into_registered_metrics(fmt) -> None:
    assert set(FIXTURE_OF) == set(FORMATS)
    questions = load(task(format=fmt, path=str(FIXTURES / FIXTURE_OF[fmt])))
    assert questions
    for question in questions:
        scorer = metric(question.record.metric)
        answers = question.record.turns[question.turn].answers
        assert 0.0 <= scorer("no answer here", answers, classes=question.record.classes) <= 1.0


def test_the_questions_of_a_row_share_one_context_cut_for_the_longest(smollm2_tokenizer) -> None:
    config = task(format="loogle", path=str(FIXTURES / "loogle" / "shortdep_qa.jsonl"))
    questions = load(config)
    first = [i for i, q in enumerate(questions) if q.record is questions[0].record]
    assert len(first) >= 2
    whole = [config.sample(smollm2_tokenizer, 100_000, i, seed=0) for i in first]
    assert {s.context for s in whole} == {questions[0].record.context}, "no cut: the row's own context"
    longest = max(len(smollm2_tokenizer(s.separator + s.question)["input_ids"]) for s in whole)
    limit = len(smollm2_tokenizer(whole[0].context)["input_ids"]) // 2 + 2 * longest
    cut = [config.sample(smollm2_tokenizer, limit, i, seed=0) for i in first]
    assert len({s.context for s in cut}) == 1 and len(cut[0].context) < len(whole[0].context)
    for sample in cut:
        assert len(smollm2_tokenizer(sample.context + sample.separator + sample.question)["input_ids"]) <= limit + 1


def test_longbench_metrics_answer_lengths_and_chat_rule_per_dataset() -> None:
    """LongBench's eval.py (dataset2metric, the first-line rule), dataset2maxlen.json and pred.py's
    chat rule, written out: (metric, first line only, max new tokens, chat template)."""
    from lorekv.eval.suites.longbench import BARE, DATASETS, ENGLISH

    expected = {
        "narrativeqa": ("qa_f1", False, 128, True), "qasper": ("qa_f1", False, 128, True),
        "multifieldqa_en": ("qa_f1", False, 64, True), "multifieldqa_zh": ("qa_f1_zh", False, 64, True),
        "hotpotqa": ("qa_f1", False, 32, True), "2wikimqa": ("qa_f1", False, 32, True),
        "musique": ("qa_f1", False, 32, True), "dureader": ("rouge_l_zh", False, 128, True),
        "gov_report": ("rouge_l", False, 512, True), "qmsum": ("rouge_l", False, 512, True),
        "multi_news": ("rouge_l", False, 512, True), "vcsum": ("rouge_l_zh", False, 512, True),
        "trec": ("classification", True, 64, False), "triviaqa": ("qa_f1", True, 32, False),
        "samsum": ("rouge_l", True, 128, False), "lsht": ("classification", True, 64, False),
        "passage_count": ("count", False, 32, True), "passage_retrieval_en": ("retrieval", False, 32, True),
        "passage_retrieval_zh": ("retrieval_zh", False, 32, True), "lcc": ("code_sim", False, 64, False),
        "repobench-p": ("code_sim", False, 64, False),
    }  # fmt: skip
    actual = {
        name: (spec.metric.removesuffix(":first_line"), spec.metric.endswith(":first_line"), spec.max_new_tokens,
               name not in BARE)
        for name, spec in DATASETS.items()
    }  # fmt: skip
    assert actual == expected
    assert len(ENGLISH) == 16 and not {"multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh"} & set(
        ENGLISH
    )
