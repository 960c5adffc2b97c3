"""The suites' own scoring rules, written out on their own for differential tests.

Each function scores ONE gold answer the way its suite's released scoring code does (LongBench
``LongBench/metrics.py`` and ``eval.py``, InfiniteBench ``src/compute_scores.py``, LooGLE
``Evaluation/automatic_metrics.py``), calling the third-party library the suite calls (``rouge``,
``jieba``, ``fuzzywuzzy`` with python-Levenshtein, ``rouge-score``). Nothing here is shared with
:mod:`lorekv.eval.suites.metrics`; where lorekv documents a deliberate choice (a score of 0 where
the suite's script would raise), the function makes the same choice and says so.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

CHINESE_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿"
    "–—‘’‛“”„‟…‧﹏."
)
"""LongBench's and InfiniteBench's extra punctuation for Chinese answers (their ``normalize_zh_answer``)."""


def f1(precision: float, recall: float) -> float:
    """The harmonic mean 2PR / (P + R), for values worked out by hand."""
    return 2 * precision * recall / (precision + recall)


def best(score: Callable[[str, str], float], prediction: str, golds: Sequence[str]) -> float:
    """LongBench's scorer: the maximum over the gold answers."""
    return max(score(prediction, gold) for gold in golds)


def token_f1(predicted: list[str], gold: list[str]) -> float:
    same = sum((Counter(predicted) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation, in LongBench's order: lower, punctuation, articles, whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def normalize_zh_answer(text: str) -> str:
    """LongBench's Chinese normalisation: lower, ASCII and Chinese punctuation, then no whitespace at all."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation + CHINESE_PUNCTUATION))
    return "".join(text.split())


def qa_f1(prediction: str, gold: str) -> float:
    return token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def qa_f1_zh(prediction: str, gold: str) -> float:
    import jieba

    def words(text: str) -> list[str]:
        return [w for w in (normalize_zh_answer(t) for t in jieba.cut(text, cut_all=False)) if len(w) > 0]

    return token_f1(words(prediction), words(gold))


def rouge_l(prediction: str, gold: str) -> float:
    """LongBench's ``rouge_score``: the package's averaged ROUGE-L F, 0 where it raises."""
    from rouge import Rouge

    try:
        return Rouge().get_scores([prediction], [gold], avg=True)["rouge-l"]["f"]
    except Exception:
        return 0.0


def rouge_l_zh(prediction: str, gold: str) -> float:
    import jieba

    return rouge_l(" ".join(jieba.cut(prediction, cut_all=False)), " ".join(jieba.cut(gold, cut_all=False)))


def code_sim(prediction: str, gold: str) -> float:
    """LongBench's ``code_sim_score``: the first line with no '`', '#' or '//', by fuzzywuzzy's ratio."""
    from fuzzywuzzy import fuzz

    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return fuzz.ratio(line, gold) / 100


def first_line(prediction: str) -> str:
    """LongBench's ``eval.py`` cut for trec, triviaqa, samsum and lsht."""
    return prediction.lstrip("\n").split("\n")[0]


def number_share(prediction: str, target: str) -> float:
    """LongBench's count and retrieval: digit runs equal to the target over all digit runs."""
    numbers = re.findall(r"\d+", prediction)
    return 0.0 if not numbers else sum(str(n) == str(target) for n in numbers) / len(numbers)


def retrieval(prediction: str, gold: str) -> float:
    return number_share(prediction, re.findall(r"Paragraph (\d+)", gold)[0])


def passkey(prediction: str, gold: str) -> float:
    """InfiniteBench's ``first_int_match``: the first non-empty piece between non-ASCII-digits."""
    pieces = [piece for piece in re.split("[^0-9]", prediction) if piece != ""]
    return float(bool(pieces) and pieces[0] == gold)


def kv_retrieval(prediction: str, gold: str) -> float:
    for character in ["\n", ":", '"', "'", ".", ",", "?", "!", "{", "}"]:
        prediction = prediction.replace(character, " ")
    return float(gold in prediction.split())


def longbook_qa_chn(prediction: str, gold: str) -> float:
    """InfiniteBench's Chinese QA: F1 over the characters of the normalised strings."""
    return token_f1(list(normalize_zh_answer(prediction)), list(normalize_zh_answer(gold)))


def longbook_sum_eng(prediction: str, gold: str) -> float:
    """InfiniteBench through ``evaluate``'s rouge: rouge-score's ROUGE-Lsum F, no stemming."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False).score(gold, prediction)["rougeLsum"].fmeasure


def loogle_rouge_l(prediction: str, gold: str) -> float:
    """LooGLE's ``get_rouge_score`` (recall; an empty output scored as 'None'); 0 where the package
    raises, lorekv's documented choice (LooGLE's script stops there)."""
    from rouge import Rouge

    try:
        return Rouge().get_scores(hyps=[prediction or "None"], refs=[gold])[0]["rouge-l"]["r"]
    except Exception:
        return 0.0
