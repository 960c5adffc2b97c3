"""Every option is checked before a model loads, with its name and allowed range."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import ValidationError

from lorekv.cost.config import BenchConfig, known_context, parse_ints, parse_names
from lorekv.validation import describe


def test_the_defaults_are_the_issues_settings() -> None:
    config = BenchConfig()
    assert config.lengths == (512, 1024, 2048, 4096) and config.futures == (1, 2, 4, 8)
    assert (config.num_futures, config.tokens, config.budget, config.repeats) == (4, 8, 128, 5)
    assert config.scorers == ("attention_mass", "loo", "projected_loo") and config.compile
    assert config.resolved_dtype == "float32" and config.resolved_threads >= 1
    assert config.positions_needed == 4096 + 32
    assert config.batch_sizes == (1, 2, 4, 8)


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"lengths": ()}, r"lengths must name at least one"),
        ({"lengths": (1,)}, r"lengths must be integers >= 2"),
        ({"lengths": (64, 64)}, r"lengths must not repeat"),
        ({"lengths": (16,)}, r"lengths: each length must be >= 32 \(the SnapKV window\)"),
        ({"futures": (0, 1)}, r"futures must be integers >= 1"),
        ({"num_futures": 0}, r"num_futures"),
        ({"tokens": 0}, r"tokens"),
        ({"repeats": 0}, r"repeats"),
        ({"decode_tokens": 1}, r"decode_tokens"),
        ({"budget": 32}, r"budget: budget must be > window"),
        ({"scorers": ("nope",)}, r"scorers must name one or more of .*projected_loo"),
        ({"scorers": ("loo", "loo")}, r"scorers must not repeat"),
        ({"threads": 0}, r"threads"),
        ({"device": "tpu"}, r"device must be cpu, cuda or cuda:<index>"),
        ({"dtype": "half"}, r"dtype"),
        ({"repeats": True}, r"repeats"),
        ({"lengths": ("512",)}, r"lengths"),
        ({"unknown": 1}, r"unknown"),
        ({"batch_sizes": ()}, r"batch_sizes must name at least one"),
        ({"batch_sizes": (0, 1)}, r"batch_sizes must be integers >= 1"),
        ({"batch_sizes": (2, 4)}, r"batch_sizes must include 1 \(the reference"),
        ({"batch_sizes": (1, 1)}, r"batch_sizes must not repeat"),
    ],
)
def test_bad_options_fail_naming_the_parameter(fields, match) -> None:
    with pytest.raises(ValidationError) as error:
        BenchConfig(**fields)
    assert re.search(match, describe(error.value)), describe(error.value)


def test_cuda_is_refused_where_there_is_none(monkeypatch) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ValidationError, match="no CUDA device is available"):
        BenchConfig(device="cuda")


def test_lengths_sorted_and_dtype_resolved_per_device(monkeypatch) -> None:
    assert BenchConfig(lengths=(1024, 512)).lengths == (512, 1024)
    assert BenchConfig(batch_sizes=(4, 1)).batch_sizes == (1, 4)
    assert BenchConfig(dtype="bfloat16").resolved_dtype == "bfloat16"
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    assert BenchConfig(device="cuda").resolved_dtype == "bfloat16"
    with pytest.raises(ValidationError, match="only 1 CUDA device"):
        BenchConfig(device="cuda:3")


def test_the_longest_prompt_must_fit_the_context() -> None:
    config = BenchConfig(lengths=(512, 8000))
    config.check_context(None)
    config.check_context(8032)
    with pytest.raises(ValueError, match=r"lengths must be <= 8000 for .*\(context 8032.*got 8001"):
        BenchConfig(lengths=(8001,)).check_context(8032)
    with pytest.raises(ValueError, match=r"lengths must be <= 7968 for .* \(context 8000"):
        config.check_context(8000)


def test_known_context_reads_a_config_without_loading_the_model(tmp_path, monkeypatch) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert known_context(str(tmp_path)) == 2048
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    assert known_context(str(tmp_path)) == 4096
    assert known_context(str(tmp_path / "missing")) is None
    monkeypatch.setenv("LOREKV_CACHE", str(tmp_path.parent))
    bundled = tmp_path.parent / "smollm2-135m-instruct"
    bundled.mkdir(exist_ok=True)
    (bundled / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert known_context("smollm2-135m-instruct") == 8192


def test_parse_lists() -> None:
    assert parse_ints("lengths", "512, 1024") == (512, 1024)
    assert parse_names("scorers", "loo,projected_loo") == ("loo", "projected_loo")
    for bad in ("", "512,", "a", "1.5"):
        with pytest.raises(ValueError, match="lengths must be comma-separated integers"):
            parse_ints("lengths", bad)
    with pytest.raises(ValueError, match="scorers must be comma-separated names"):
        parse_names("scorers", "loo,,x")
