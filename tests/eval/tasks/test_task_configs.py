"""Task configs: the registry, labels, parsing errors, seeds and length checks."""

from __future__ import annotations

import pytest

from lorekv.eval.tasks import TASKS, TaskConfig, check_length, make_sample, parse_task, sample_seed

FAMILIES = [
    "common_words",
    "frequent_words",
    "list_recall",
    "niah_multikey",
    "niah_multiquery",
    "niah_multivalue",
    "niah_single",
    "qa",
    "variable_tracking",
]


class ExplodingTokenizer:
    """Fails when used: checks must happen before any tokenization."""

    chat_template = None

    def __call__(self, *args, **kwargs):
        raise AssertionError("tokenizer used before the arguments were checked")


def test_every_family_is_registered_with_a_strict_config() -> None:
    assert TASKS.names() == FAMILIES
    for name in FAMILIES:
        config_cls = TASKS.config_class(name)
        assert issubclass(config_cls, TaskConfig)
        assert config_cls.model_config["extra"] == "forbid"
        assert config_cls.model_config["strict"] is True
        assert parse_task(name).name == name


def test_labels_name_the_non_default_options_in_field_order() -> None:
    assert parse_task("niah_single").label == "niah_single"
    assert parse_task({"name": "niah_single", "value": "uuid", "haystack": "noise"}).label == (
        "niah_single[haystack=noise,value=uuid]"
    )
    # A default given explicitly is still the default.
    assert parse_task({"name": "niah_single", "value": "number"}).label == "niah_single"
    assert parse_task({"name": "variable_tracking", "num_hops": 2}).label == "variable_tracking[num_hops=2]"
    assert parse_task({"name": "common_words", "freq_common": 9}).label == "common_words[freq_common=9]"


def test_parse_accepts_a_config_object() -> None:
    config = parse_task({"name": "niah_multivalue", "num_values": 6})
    assert parse_task(config) is config
    assert config.num_values == 6


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("needle_in_a_box", ["unknown task", "niah_single", "qa"]),
        ({"name": "niah_single", "depth": 0.5}, ["niah_single", "depth", "options", "haystack"]),
        ({"name": "niah_single", "value": "colour"}, ["value", "colour"]),
        ({"name": "niah_multivalue", "num_values": 1}, ["num_values", ">= 2"]),
        ({"name": "niah_multivalue", "num_values": "4"}, ["num_values"]),
        ({"name": "niah_multiquery", "num_queries": True}, ["num_queries"]),
        ({"name": "niah_multikey", "num_distractors": 0}, ["num_distractors", ">= 1"]),
        ({"name": "niah_multikey", "haystack": "needles", "num_distractors": 5}, ["num_distractors", "needles"]),
        ({"name": "variable_tracking", "num_hops": 0}, ["num_hops", ">= 1"]),
        ({"name": "frequent_words", "alpha": 0.5}, ["alpha", "[1.1, 10.0]"]),
        ({"name": "qa", "num_facts": 6}, ["num_facts", "[1, 5]"]),
        ({"num_values": 4}, ["needs a 'name'"]),
    ],
)
def test_bad_specs_give_one_line_errors_naming_the_parameter(spec, words) -> None:
    with pytest.raises(ValueError) as error:
        parse_task(spec)
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_sample_seed_is_stable_and_depends_on_every_coordinate() -> None:
    seed = sample_seed(0, "niah_single", 1024, 3)
    assert seed == sample_seed(0, "niah_single", 1024, 3)
    assert seed == 11759441281060818047  # SHA-256 based: the same in every process and Python version
    others = {
        sample_seed(1, "niah_single", 1024, 3),
        sample_seed(0, "niah_single[value=uuid]", 1024, 3),
        sample_seed(0, "niah_single", 2048, 3),
        sample_seed(0, "niah_single", 1024, 4),
    }
    assert seed not in others and len(others) == 4
    assert 0 <= seed < 2**64


@pytest.mark.parametrize("length", [255, 0, -1, 512.0, True, "512"])
def test_length_must_be_an_integer_of_at_least_256(length) -> None:
    with pytest.raises(ValueError, match="length must be an integer >= 256"):
        check_length(length)
    with pytest.raises(ValueError, match="length"):
        make_sample("niah_single", ExplodingTokenizer(), length)


def test_content_that_cannot_fit_is_refused_before_any_work() -> None:
    assert check_length(256) == 256
    with pytest.raises(ValueError, match=r"task common_words: num_common=10 x freq_common=6 needs a length >= \d+"):
        make_sample("common_words", ExplodingTokenizer(), 256)
    with pytest.raises(ValueError, match=r"task niah_multivalue\[num_values=40\]: num_values=40 .* length >= \d+"):
        check_length(512, {"name": "niah_multivalue", "num_values": 40})
    with pytest.raises(ValueError, match=r"task variable_tracking\[num_chains=10\]: num_chains=10, num_hops=4"):
        check_length(512, {"name": "variable_tracking", "num_chains": 10})
    with pytest.raises(ValueError, match=r"task qa\[num_facts=5\]: num_facts=5 needs a length >= \d+"):
        check_length(512, {"name": "qa", "num_facts": 5})
    with pytest.raises(ValueError, match="freq_common .* must exceed freq_uncommon"):
        check_length(512, {"name": "common_words", "freq_common": 1})


def test_bad_index_or_seed_is_refused() -> None:
    with pytest.raises(ValueError, match="index must be an integer >= 0"):
        make_sample("niah_single", ExplodingTokenizer(), 512, index=-1)
    with pytest.raises(ValueError, match="seed must be an integer"):
        make_sample("niah_single", ExplodingTokenizer(), 512, seed=True)


def test_a_length_beyond_the_word_lists_is_refused_clearly(tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match=r"task common_words: length 40000 is too long for the bundled word lists"):
        make_sample("common_words", tiny_tokenizer, 40_000)
