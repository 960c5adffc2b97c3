"""LongBench (v1 and LongBench-E) rows: its per-dataset prompts, answer lengths, metrics and chat rule.

LongBench (Bai et al., https://arxiv.org/abs/2308.14508; code at
https://github.com/THUDM/LongBench, folder ``LongBench/``) ships one JSONL file per dataset
(``hotpotqa.jsonl``; LongBench-E: ``hotpotqa_e.jsonl``) with rows ``input``, ``context``,
``answers``, ``length``, ``dataset``, ``language``, ``all_classes`` and ``_id``. The prompt
templates are ``config/dataset2prompt.json`` and the answer lengths
``config/dataset2maxlen.json``, verbatim; the metric of each dataset is ``eval.py``'s
``dataset2metric``, with its first-line rule for trec, triviaqa, samsum and lsht; ``pred.py``
leaves trec, triviaqa, samsum, lsht, lcc and repobench-p without the chat template ("chat
models are better off without build prompts on these tasks") and truncates a prompt over the
model's limit in the middle. LongBench-E's scores are also reported by the rows' ``length``
(words): 0-4k, 4-8k, 8k+ (``eval.py``'s ``scorer_e``).

Two departures, both in decoding: LongBench stops samsum at a newline (its first line is what
is scored either way), and runs greedy decoding through its own loop; lorekv decodes greedily
with the harness.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from lorekv.eval.suites.record import Record, RowError, SuiteFormat, Turn, answers_of, register, required_field


class Dataset(NamedTuple):
    """A LongBench dataset: its prompt template, answer length and metric name."""

    template: str
    max_new_tokens: int
    metric: str


_PASSAGES = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
)
DATASETS: dict[str, Dataset] = {
    "narrativeqa": Dataset(
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\n"
        "Story: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a single "
        "phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
        128,
        "qa_f1",
    ),
    "qasper": Dataset(
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on the information in the "
        'article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or '
        '"unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on '
        "the above article as concisely as you can, using a single phrase or sentence if possible. If the question "
        'cannot be answered based on the information in the article, write "unanswerable". If the question is a '
        'yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\n'
        "Question: {input}\n\nAnswer:",
        128,
        "qa_f1",
    ),
    "multifieldqa_en": Dataset(
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on "
        "the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
        64,
        "qa_f1",
    ),
    "multifieldqa_zh": Dataset(
        "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。"
        "\n\n问题：{input}\n回答：",
        64,
        "qa_f1_zh",
    ),
    **{
        name: Dataset(
            f"{_PASSAGES}\n\nThe following are given passages.\n{{context}}\n\n{_PASSAGES}\n\nQuestion: {{input}}"
            "\nAnswer:",
            32,
            "qa_f1",
        )
        for name in ("hotpotqa", "2wikimqa", "musique")
    },
    "dureader": Dataset(
        "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
        128,
        "rouge_l_zh",
    ),
    "gov_report": Dataset(
        "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n"
        "{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",
        512,
        "rouge_l",
    ),
    "qmsum": Dataset(
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
        "one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting "
        "transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",
        512,
        "rouge_l",
    ),
    "multi_news": Dataset(
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
        "Now, write a one-page summary of all the news.\n\nSummary:",
        512,
        "rouge_l",
    ),
    "vcsum": Dataset(
        "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
        512,
        "rouge_l_zh",
    ),
    "trec": Dataset(
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
        64,
        "classification:first_line",
    ),
    "triviaqa": Dataset(
        "Answer the question based on the given passage. Only give me the answer and do not output any other words. "
        "The following are some examples.\n\n{context}\n\n{input}",
        32,
        "qa_f1:first_line",
    ),
    "samsum": Dataset(
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
        128,
        "rouge_l:first_line",
    ),
    "lsht": Dataset("请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}", 64, "classification:first_line"),
    "passage_count": Dataset(
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully "
        "read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In "
        "other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final "
        "count of unique paragraphs after removing duplicates. The output format should only contain the number, "
        "such as 1, 2, 3, and so on.\n\nThe final answer is: ",
        32,
        "count",
    ),
    "passage_retrieval_en": Dataset(
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of "
        'the paragraph that the abstract is from. The answer format must be like "Paragraph 1", "Paragraph 2", '
        "etc.\n\nThe answer is: ",
        32,
        "retrieval",
    ),
    "passage_retrieval_zh": Dataset(
        "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{input}\n\n"
        '请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n答案是：',
        32,
        "retrieval_zh",
    ),
    "lcc": Dataset("Please complete the code given below. \n{context}Next line of code:\n", 64, "code_sim"),
    "repobench-p": Dataset(
        "Please complete the code given below. \n{context}{input}Next line of code:\n", 64, "code_sim"
    ),
}
"""LongBench's datasets (``config/dataset2prompt.json``, ``config/dataset2maxlen.json`` and
``eval.py``'s metrics, as lorekv's metric names)."""

ENGLISH = tuple(name for name in DATASETS if not name.endswith("_zh") and name not in ("dureader", "vcsum", "lsht"))
"""The 16 English datasets (the Chinese five are multifieldqa_zh, dureader, vcsum, lsht, passage_retrieval_zh)."""

BARE = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
"""Datasets LongBench prompts without the chat template (``pred.py``)."""


def length_bucket(words: int) -> str:
    """LongBench-E's length group of a row of ``words`` words (``eval.py``'s ``scorer_e``)."""
    return "0-4k" if words < 4000 else "4-8k" if words < 8000 else "8k+"


def split_template(template: str, fields: Mapping[str, str]) -> tuple[str, str]:
    """(head, tail): ``template`` filled in with ``fields``, cut right after ``{context}``."""
    head, tail = template.split("{context}")
    return head.format(**fields) + fields["context"], tail.format(**fields)


@register
class LongBench(SuiteFormat):
    """LongBench v1 and LongBench-E rows (a ``_e`` dataset name or file is LongBench-E)."""

    name = "longbench"
    suite = "LongBench"
    fields = ("input", "context", "answers", "dataset")
    subtasks = tuple(DATASETS) + tuple(f"{name}_e" for name in DATASETS)

    def subtask_hint(self, source: str) -> str | None:
        return Path(source).stem

    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        dataset = required_field(row, "dataset")
        base = dataset.removesuffix("_e")
        if base not in DATASETS:
            raise RowError(f"unknown LongBench dataset {dataset!r}; known: {', '.join(DATASETS)}")
        if dataset.endswith("_e") or (subtask or "").endswith("_e"):
            dataset = f"{base}_e"  # LongBench-E, whose files are named <dataset>_e.jsonl
        spec = DATASETS[base]
        text = {"context": required_field(row, "context"), "input": required_field(row, "input")}
        head, tail = split_template(spec.template, text)
        classes = row.get("all_classes") or ()
        if not isinstance(classes, (list, tuple)) or not all(isinstance(c, str) for c in classes):
            raise RowError(f"field 'all_classes' must be a list of strings or null, got {type(classes).__name__}")
        if spec.metric.startswith("classification") and not classes:
            raise RowError(f"dataset {dataset!r} is scored by classification and needs 'all_classes'")
        words = row.get("length")
        tags = {"length": length_bucket(words)} if isinstance(words, int) and dataset != base else {}
        return Record(
            subtask=dataset,
            context=head,
            turns=(Turn(tail, answers_of(row["answers"])),),
            metric=spec.metric,
            max_new_tokens=spec.max_new_tokens,
            chat=base not in BARE,
            truncate=True,
            classes=tuple(classes),
            tags=tags,
        )
