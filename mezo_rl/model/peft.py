"""Parameter-efficient MeZO: LoRA and prefix-tuning adapters (paper §3, Appendix D.3).

MeZO can tune any subset of parameters. With an adapter, a step perturbs a few hundred thousand
numbers instead of the whole model, and the trained artefact is a small file.

    lm = load_model("smollm2-135m")
    apply_peft(lm, "prefix")                      # or "lora"; base weights frozen, adapter trainable
    params = [p for p in lm.model.parameters() if p.requires_grad]
    opt = MeZO(params, **mezo_options(MODE_DEFAULTS["prefix"]))  # the mode's lr / eps (mezo_rl.training.defaults)
    ...
    peft_config(lm)                               # JSON dict stored in checkpoints
    apply_peft(fresh_lm, **peft_config(lm))       # rebuilds the identical initial adapter
    export_model(lm, "out/")                      # adapter files; merged=True folds LoRA into W

Both adapters live inside the Hugging Face model (``lm.model``) and act through its ordinary
forward, so ``lm.model(...)``, the bare decoder ``lm.model.model(...)`` and ``generate`` with a KV
cache all see them; the LanguageModel wrapper needs no change.

LoRA (r=8, alpha=16 on the attention query and value projections) is the peft library's LoRA,
injected in place with ``peft.inject_adapter_in_model`` (no PeftModel wrapper, so the model keeps
its class and attributes). A starts Kaiming-uniform and B at zero (the model is unchanged at step 0),
both drawn from ``seed``.

Prefix-tuning is our own small implementation (see docs/peft.md for why not peft's): each attention
layer gets ``num_prefix_tokens`` learned key/value pairs, shaped like that layer's key/value states
``[num_key_value_heads, m, head_dim]``, that every query may attend to. They are initialised from
real activations (Appendix D.3): ``m`` vocabulary tokens drawn with ``seed`` are run through the
frozen model and each layer's keys and values for them become that layer's prefix. For
rotary-position models the tokens are run at positions ``-m..-1``, so the prefix sits just before
the first real token (position 0): at initialisation the adapted model computes exactly what the
plain model computes on ``[sampled tokens] + input``.
"""
from __future__ import annotations

import copy
import importlib
import json
import os
import re
from contextlib import contextmanager

import torch
from torch import nn

from mezo_rl.errors import ConfigError
from mezo_rl.model.decoding import returned_cache
from mezo_rl.model.dropout import check_dropout, install_step_dropout
from mezo_rl.model.lm import FINAL_NORM_MODULES

PEFT_METHODS = ("lora", "prefix")

# the gains of the final normalisation layer (mezo_rl.model.lm.FINAL_NORM_MODULES: Llama/Gemma/Mistral/Qwen, GPT-2, OPT, Falcon)
FINAL_NORM = "^(" + "|".join(re.escape(name) for name in FINAL_NORM_MODULES) + r")\.weight$"

_CONFIG_ATTR = "mezo_peft_config"   # where apply_peft records its config on the HF model
_PREFIX_ATTR = "mezo_prefix"        # the PrefixKV child module added to each attention layer
_PREFIX_ATTENTION = "mezo_prefix"   # our name in transformers' attention-function registry
_CONFIG_FILE = "mezo_peft.json"     # written by export_model beside the adapter weights
_PREFIX_WEIGHTS = "prefix_model.safetensors"


# --------------------------------------------------------------------------------------------- API

def set_trainable(lm, mode: str, *, trainable: str | None = None, modules_to_save=None, r: int = 8,
                  alpha: float = 16, target_modules=None, dropout: float = 0.0, num_prefix_tokens: int = 5,
                  seed: int = 0):
    """Set ``lm`` up, in place, for what ``mode`` (``--peft``) trains; return it.

    - ``norm``: every weight but the final normalisation layer's gains (:data:`FINAL_NORM`) is frozen,
      and the model's trunk cache is turned on (:meth:`~mezo_rl.model.lm.LanguageModel.enable_trunk_cache`):
      each scored sequence runs through the frozen trunk once, later scores run only the final norm and
      the output head. The cache cannot see frozen weights edited in place; a run never edits them (MeZO
      and replay change the trainable gains only), and code that does must call ``lm.clear_trunk_cache()``.
      No other mode turns the cache on.
    - ``lora`` / ``prefix``: the adapter is added (:func:`apply_peft`, with ``r``, ``alpha``,
      ``target_modules`` (None: its default; ``"all-linear"`` included), LoRA's ``dropout``, ``num_prefix_tokens``
      and ``seed``),
      the base frozen; the modules named ``modules_to_save`` (as peft's ``LoraConfig`` names them) train
      beside it.
    - ``full``: every weight stays trainable.

    ``trainable`` (a ``re.search`` pattern over parameter names) then freezes the trainable weights it does not
    match; a trainable weight a device map offloaded is refused (:func:`check_no_offload`). Deterministic in
    (base weights, these arguments), so a replay rebuilds the same trainable tensors.
    """
    if mode in PEFT_METHODS:
        targets = {} if target_modules is None else {"target_modules": target_modules}
        lora = {"dropout": dropout} if mode == "lora" and dropout else {}
        _add_adapter(lm, mode, r=r, alpha=alpha, num_prefix_tokens=num_prefix_tokens, seed=seed, **targets, **lora)
        if modules_to_save:
            train_modules(lm.model, modules_to_save)
    elif mode == "norm":
        freeze_unmatched(lm.model, FINAL_NORM, what="--peft norm (the final normalisation layer)")
    if trainable is not None:
        freeze_unmatched(lm.model, trainable, what=f"--trainable {trainable!r}")
    check_no_offload(lm.model)  # a trainable weight offloaded to disk cannot be perturbed in place
    if mode == "lora" and dropout:  # the adapter's layers are final: each gets the step's dropout
        install_step_dropout(lm.model, dropout)
    if mode == "norm":  # the trunk is frozen now, whatever ``trainable`` kept
        lm.enable_trunk_cache()
    return lm


def check_no_offload(model: nn.Module) -> None:
    """Raise if a trainable parameter of ``model`` is not materialised on a real device.

    MeZO perturbs and updates its trainable weights *in place*. accelerate's CPU/disk offload
    (``device_map="auto"`` when ``max_memory`` leaves no room on the accelerators, or explicit "cpu"/"disk"
    entries next to GPU entries) keeps such weights on the ``meta`` device and re-loads them from a side copy
    at every forward pass, so an in-place perturbation or update would silently be lost. A frozen weight is
    never written, so it may be offloaded. Spreading a model over several accelerators (every weight resident
    on some GPU) is fine and is what the MeZO paper did for OPT-30B/66B.
    """
    offloaded = [name for name, p in model.named_parameters() if p.requires_grad and p.device.type == "meta"]
    if offloaded:
        shown = ", ".join(offloaded[:5]) + (f" (and {len(offloaded) - 5} more)" if len(offloaded) > 5 else "")
        raise ValueError(
            f"{len(offloaded)} trainable parameter(s) are offloaded (on the 'meta' device): {shown}. MeZO "
            "updates its trainable weights in place and cannot train offloaded ones. Give max_memory enough room "
            "on the devices you list (or add devices) so that every trainable weight is resident; use 'cpu' as a "
            "device only when there is no GPU at all."
        )


def train_modules(model: nn.Module, names: list[str]) -> None:
    """Train every weight of the modules named ``names`` (the last part of the module name, as peft's
    ``modules_to_save``) beside an adapter; one line when a name matches no module."""
    found = set()
    for module_name, module in model.named_modules():
        leaf = module_name.rsplit(".", 1)[-1]
        if leaf in names:
            found.add(leaf)
            for p in module.parameters():
                p.requires_grad_(True)
    missing = [n for n in names if n not in found]
    if missing:
        raise ConfigError(f"--lora-modules-to-save {missing}: no module of that name in {type(model).__name__}")


def freeze_unmatched(model: nn.Module, pattern: str, what: str) -> None:
    """Freeze every trainable parameter whose name does not match ``pattern`` (``re.search``).

    Deterministic in (model, pattern), so a replay rebuilds the same trainable set in the same order.
    """
    regex = re.compile(pattern)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not any(regex.search(n) for n, _ in trainable):
        names = ", ".join(n for n, _ in trainable[:4])
        raise ConfigError(f"{what}: {pattern!r} matches no trainable parameter; names look like: {names}, ...")
    for n, p in trainable:
        if not regex.search(n):
            p.requires_grad_(False)


def apply_peft(lm, method: str, *, r: int = 8, alpha: float = 16, target_modules=("q_proj", "v_proj"),
               dropout: float = 0.0, num_prefix_tokens: int = 5, seed: int = 0):
    """Add a LoRA or prefix adapter to ``lm.model`` in place; freeze everything else; return ``lm``.

    Args:
        lm: a LanguageModel (anything with ``.model``, a transformers PreTrainedModel, and
            ``.tokenizer``).
        method: ``"lora"`` or ``"prefix"``.
        r, alpha: LoRA rank and scale; the layer computes ``W x + (alpha / r) B A x``.
        target_modules: names of the linear layers LoRA wraps (matched against the last part of
            module names). The default ``("q_proj", "v_proj")`` is the paper's choice (query and
            value). If the model has no module of those names (e.g. GPT-2's ``c_attn``, BERT's
            ``query``/``value``) the default is replaced by peft's standard mapping for the
            architecture; an explicit list is used as given.
        dropout: LoRA's dropout on the adapter's input, in [0, 1): drawn only while a training step evaluates
            its members, the same masks for every member of the step (:mod:`mezo_rl.model.dropout`); the
            identity everywhere else. LoRA only.
        num_prefix_tokens: prefix length m per layer (paper: 5).
        seed: draws LoRA's A matrices and the prefix's initial tokens. The adapter is a pure function
            of (seed, base weights, these arguments), which is what makes trajectory replay work:
            ``apply_peft(fresh_lm, **peft_config(lm))`` rebuilds the same initial adapter.
    """
    _add_adapter(lm, method, r=r, alpha=alpha, target_modules=target_modules, dropout=dropout,
                 num_prefix_tokens=num_prefix_tokens, seed=seed)
    install_step_dropout(lm.model, dropout)
    return lm


def _add_adapter(lm, method: str, *, r: int = 8, alpha: float = 16, target_modules=("q_proj", "v_proj"),
                 dropout: float = 0.0, num_prefix_tokens: int = 5, seed: int = 0) -> None:
    """:func:`apply_peft`'s adapter, recorded on the model, without its step dropout (which its caller installs
    once the trainable layers are final)."""
    model = lm.model
    if getattr(model, _CONFIG_ATTR, None) is not None:
        raise ValueError(f"this model already has a {getattr(model, _CONFIG_ATTR)['method']!r} adapter; "
                         "apply_peft works on a model without one (load the base model again)")
    if dropout and method != "lora":
        raise ValueError(f"dropout is LoRA's; a {method!r} adapter takes none, got dropout={dropout!r}")
    if method == "lora":
        config = _apply_lora(model, r=int(r), alpha=alpha, target_modules=target_modules, dropout=float(dropout),
                             seed=int(seed))
    elif method == "prefix":
        config = _apply_prefix(model, lm.tokenizer, num_prefix_tokens=int(num_prefix_tokens), seed=int(seed))
    else:
        raise ValueError(f"unknown PEFT method {method!r}; accepted: {', '.join(PEFT_METHODS)} "
                         "(use no adapter for full-parameter MeZO)")
    setattr(model, _CONFIG_ATTR, config)


def peft_config(lm) -> dict | None:
    """The adapter's configuration as a JSON-serialisable dict (``None`` without adapter).

    Pass it back as ``apply_peft(lm, **cfg)`` on the same base model to rebuild the initial adapter.
    """
    config = getattr(lm.model, _CONFIG_ATTR, None)
    return None if config is None else json.loads(json.dumps(config))


def adapter_state_dict(lm) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the names used in the exported files (empty without adapter)."""
    method = (peft_config(lm) or {}).get("method")
    if method == "lora":
        from peft import get_peft_model_state_dict

        return {"base_model.model." + k: v for k, v in get_peft_model_state_dict(lm.model).items()}
    if method == "prefix":
        return {f"layers.{i}.{part}": getattr(prefix, part)
                for i, prefix in enumerate(_prefix_modules(lm.model)) for part in ("keys", "values")}
    return {}


def export_model(lm, out_dir, merged: bool = False) -> str:
    """Write the adapter (default) or, for LoRA with ``merged=True``, a full merged model.

    Adapter files in ``out_dir``:
      * ``mezo_peft.json``: ``{"peft_config": ..., "base_model": ..., "format": ...}``, read by
        :func:`load_adapter`.
      * LoRA: ``adapter_config.json`` + ``adapter_model.safetensors`` in the peft library's format, so
        ``peft.PeftModel.from_pretrained(base_model, out_dir)`` also loads it.
      * prefix: ``prefix_model.safetensors`` with ``layers.{i}.keys`` and ``layers.{i}.values`` of
        shape ``[num_key_value_heads, m, head_dim]``: the keys/values prepended in layer i, keys
        already rotated (RoPE) to positions ``-m..-1``.

    ``merged=True`` writes ``save_pretrained`` files (plus the tokenizer) of the base model with
    ``W + (alpha / r) B A`` folded into each wrapped layer: a plain model any transformers code loads.
    A prefix cannot be folded into weights, so ``merged=True`` with a prefix raises. Without an
    adapter, ``export_model`` saves the (fully tuned) model itself. Returns ``out_dir``.
    """
    config = peft_config(lm)
    method = config["method"] if config else None
    os.makedirs(out_dir, exist_ok=True)
    if method is None or merged:
        if method == "prefix":
            raise ValueError("a prefix adapter cannot be merged into the model weights (it adds "
                             "attention keys/values, not a weight delta); export it with merged=False")
        if method == "lora":
            with _lora_merged(lm.model):
                lm.model.save_pretrained(out_dir)
        else:
            lm.model.save_pretrained(out_dir)
        if getattr(lm, "tokenizer", None) is not None:
            lm.tokenizer.save_pretrained(out_dir)
        return str(out_dir)

    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in adapter_state_dict(lm).items()}
    base_name = getattr(lm.model.config, "_name_or_path", "") or ""
    if method == "lora":
        _lora_peft_config(config, base_name).save_pretrained(out_dir)
        save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
        fmt = "peft-lora"
    else:
        save_file(tensors, os.path.join(out_dir, _PREFIX_WEIGHTS), metadata={"format": "pt"})
        fmt = "mezo-prefix"
    with open(os.path.join(out_dir, _CONFIG_FILE), "w") as f:
        json.dump({"peft_config": config, "base_model": base_name, "format": fmt}, f, indent=2)
    return str(out_dir)


def load_adapter(lm, adapter_dir):
    """Apply the adapter saved by ``export_model(lm, adapter_dir)`` to a base ``lm``; return ``lm``."""
    from safetensors.torch import load_file

    path = os.path.join(adapter_dir, _CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {adapter_dir} is not an adapter written by export_model")
    with open(path) as f:
        config = json.load(f)["peft_config"]
    apply_peft(lm, **config)
    if config["method"] == "lora":
        from peft import set_peft_model_state_dict

        tensors = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
        tensors = {k.removeprefix("base_model.model."): v for k, v in tensors.items()}
        result = set_peft_model_state_dict(lm.model, tensors)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing:
            raise ValueError(f"{adapter_dir} lacks adapter tensors {missing[:4]}")
    else:
        tensors = load_file(os.path.join(adapter_dir, _PREFIX_WEIGHTS))
        current = adapter_state_dict(lm)
        if set(tensors) != set(current):
            raise ValueError(f"{adapter_dir}: prefix tensors {sorted(tensors)[:4]}... do not match "
                             f"this model's layers {sorted(current)[:4]}...")
        with torch.no_grad():
            for name, param in current.items():
                param.copy_(tensors[name])
    return lm


# -------------------------------------------------------------------------------------------- LoRA

def _apply_lora(model, *, r, alpha, target_modules, dropout, seed):
    try:
        from peft import inject_adapter_in_model
    except ImportError as e:
        raise ImportError("LoRA needs the peft library: pip install 'mezo-rl[peft]'") from e
    if r < 1:
        raise ValueError(f"LoRA rank r must be a positive integer, got {r}")
    check_dropout(dropout)
    targets = _resolve_lora_targets(model, target_modules)
    config = dict(method="lora", r=r, alpha=alpha, target_modules=targets, seed=seed)
    if dropout:  # recorded where it is on: a config without it is an adapter without dropout
        config["dropout"] = dropout
    model.requires_grad_(False)
    with _seeded(seed):  # nn.Linear construction and A's Kaiming init draw from the global RNG
        inject_adapter_in_model(_lora_peft_config(config, ""), model)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    return config


def _lora_peft_config(config, base_name):
    from peft import LoraConfig

    return LoraConfig(r=config["r"], lora_alpha=config["alpha"], target_modules=config["target_modules"],
                      lora_dropout=config.get("dropout", 0.0), bias="none", task_type="CAUSAL_LM",
                      base_model_name_or_path=base_name)


def _resolve_lora_targets(model, target_modules):
    """The layer names LoRA wraps: ``target_modules`` as given; ``"all-linear"`` is every linear layer but the
    output head, as peft reads it; the default ``("q_proj", "v_proj")`` falls back to peft's mapping for the
    architecture where the model has no such layers."""
    if isinstance(target_modules, str):
        target_modules = [target_modules]
    targets = list(target_modules)
    if targets == ["all-linear"]:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        targets = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                          if isinstance(m, nn.Linear) and m is not head and "." in n})
    leaf_names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if not leaf_names.intersection(targets) and tuple(targets) == ("q_proj", "v_proj"):
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as MAPPING

        targets = list(MAPPING.get(model.config.model_type, targets))
    missing = [t for t in targets if t not in leaf_names]
    if not targets or missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"LoRA target_modules {missing or targets} not found in {type(model).__name__}; "
                         f"its linear layers are named: {', '.join(linear)}")
    return targets


@contextmanager
def _lora_merged(model):
    """Temporarily swap each LoRA layer for its base layer holding ``W + (alpha/r) B A``."""
    from peft.tuners.lora import LoraLayer

    swapped = []
    try:
        for name, module in list(model.named_modules()):
            if isinstance(module, LoraLayer):
                base = module.get_base_layer()
                original = base.weight
                base.weight = nn.Parameter(original + module.get_delta_weight("default"), requires_grad=False)
                parent_name, _, child = name.rpartition(".")
                parent = model.get_submodule(parent_name)
                setattr(parent, child, base)
                swapped.append((parent, child, module, base, original))
        yield model
    finally:
        for parent, child, module, base, original in swapped:
            base.weight = original
            setattr(parent, child, module)


# ------------------------------------------------------------------------------------------ prefix

class PrefixKV(nn.Module):
    """The learned prefix of one attention layer: ``keys``/``values`` of shape [kv_heads, m, head_dim].

    Every query of the layer attends to these m positions in addition to the real tokens (also the
    left-padding rows and every generation step; the KV cache itself never holds them).

    Batched member evaluation (:mod:`mezo_rl.engine.population`) sets ``member_params`` to per-member copies
    ``{"keys": [M, kv_heads, m, head_dim], "values": ...}`` for the duration of a pass; rows
    [k*b, (k+1)*b) of every batch then attend to member k's prefix.
    """

    accepts_member_params = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, attn_implementation: str, eager_fn=None):
        super().__init__()
        self.keys = nn.Parameter(keys.clone())
        self.values = nn.Parameter(values.clone())
        self.attn_implementation = attn_implementation   # the layer's own attention: "sdpa" or "eager"
        self.eager_fn = eager_fn                         # the model's eager_attention_forward (for "eager")
        self.member_params = None

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[1]

    def expanded(self, name: str, batch: int, dtype) -> torch.Tensor:
        """``keys`` or ``values`` for a batch of ``batch`` rows: [batch, kv_heads, m, head_dim]."""
        per_member = (self.member_params or {}).get(name)
        if per_member is None:
            return getattr(self, name).to(dtype).expand(batch, -1, -1, -1)
        M = per_member.shape[0]
        if batch % M:
            raise ValueError(f"member_evaluation='batched': a prefix attention got {batch} rows for {M} members; every "
                             f"forward pass of a batched closure must hold {M} equal blocks of rows")
        return per_member.to(dtype)[:, None].expand(-1, batch // M, -1, -1, -1).reshape(batch, *per_member.shape[1:])


def _apply_prefix(model, tokenizer, *, num_prefix_tokens, seed):
    if num_prefix_tokens < 1:
        raise ValueError(f"num_prefix_tokens must be a positive integer, got {num_prefix_tokens}")
    attn_impl = model.config._attn_implementation
    if attn_impl not in ("sdpa", "eager"):
        raise ValueError(f"prefix-tuning supports attn_implementation 'sdpa' or 'eager', the model uses "
                         f"{attn_impl!r}; load it with attn_implementation='sdpa'")
    layers = _attention_layers(model)
    keys, values = _real_activation_kv(model, tokenizer, num_prefix_tokens, seed)
    from transformers import AttentionInterface

    AttentionInterface.register(_PREFIX_ATTENTION, _prefix_attention)  # global registry; idempotent
    model.requires_grad_(False)
    for attn in layers:
        eager_fn = _eager_attention(attn) if attn_impl == "eager" else None
        setattr(attn, _PREFIX_ATTR, PrefixKV(keys[attn.layer_idx], values[attn.layer_idx], attn_impl, eager_fn))
        # Route this layer (only) through _prefix_attention: a private copy of the config that names it.
        attn.config = copy.copy(attn.config)
        attn.config._attn_implementation_internal = _PREFIX_ATTENTION
    model.base_model.register_forward_pre_hook(_positions_from_padding_mask, with_kwargs=True)
    return dict(method="prefix", num_prefix_tokens=num_prefix_tokens, seed=seed)


def _attention_layers(model):
    layers = [m for m in model.modules()
              if isinstance(getattr(m, "layer_idx", None), int) and hasattr(m, "config")
              and type(m).__name__.endswith("Attention")]
    if not layers or getattr(model.config, "is_encoder_decoder", False) or not _is_causal_lm(model):
        raise ValueError(f"prefix-tuning needs a decoder-only causal LM (Llama, Qwen, Gemma, SmolLM, ...); "
                         f"{type(model).__name__} is not one")
    return layers


def _is_causal_lm(model):
    return type(model).__name__.endswith("ForCausalLM")


@torch.no_grad()
def _real_activation_kv(model, tokenizer, m, seed):
    """Keys and values of m seeded random vocabulary tokens in every layer of the frozen model.

    Returns ``(keys, values)``: lists indexed by layer, each ``[kv_heads, m, head_dim]``. Special
    tokens are never drawn. With rotary embeddings the tokens sit at positions -m..-1, i.e. directly
    before position 0 where real inputs start.
    """
    vocab = model.get_input_embeddings().num_embeddings
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    allowed = torch.tensor([i for i in range(vocab) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    ids = allowed[torch.randint(len(allowed), (1, m), generator=generator)]
    device = model.get_input_embeddings().weight.device
    positions = torch.arange(m) - (m if hasattr(model.base_model, "rotary_emb") else 0)
    out = model.base_model(input_ids=ids.to(device), position_ids=positions[None].to(device), use_cache=True)
    cache = returned_cache(out)
    keys = [layer.keys[0] for layer in cache.layers]
    values = [layer.values[0] for layer in cache.layers]
    return keys, values


def _prefix_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention with the layer's prefix keys/values in front of the real (and cached) ones."""
    prefix = getattr(module, _PREFIX_ATTR)
    m, batch = prefix.num_tokens, key.shape[0]
    key = torch.cat([prefix.expanded("keys", batch, key.dtype), key], dim=2)
    value = torch.cat([prefix.expanded("values", batch, value.dtype), value], dim=2)
    is_causal = kwargs.pop("is_causal", None)
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    q_len, kv_len = query.shape[2], key.shape[2] - m
    if attention_mask is None and is_causal and q_len > 1:
        # sdpa skipped the mask (no padding) and would use is_causal, whose top-left alignment is
        # wrong once keys outnumber queries: spell out "prefix visible, real keys causal".
        rows = torch.arange(q_len, device=query.device)[:, None] + (kv_len - q_len)
        attention_mask = rows >= torch.arange(kv_len, device=query.device)[None, :]
        attention_mask = attention_mask[None, None]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            visible = attention_mask.new_ones(*attention_mask.shape[:-1], m)
        else:  # additive float mask: 0 where visible
            visible = attention_mask.new_zeros(*attention_mask.shape[:-1], m)
        attention_mask = torch.cat([visible, attention_mask[..., :kv_len]], dim=-1)
    if prefix.attn_implementation == "eager":
        if attention_mask is not None and attention_mask.dtype == torch.bool:  # eager adds the mask to scores
            attention_mask = torch.zeros_like(attention_mask, dtype=query.dtype).masked_fill(
                ~attention_mask, torch.finfo(query.dtype).min)
        return prefix.eager_fn(module, query, key, value, attention_mask, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, is_causal=False, **kwargs)


def _positions_from_padding_mask(module, args, kwargs):
    """Decoder pre-hook: with a 2-D padding mask and no position_ids, count positions from the first
    real token (as ``generate`` does), so a left-padded row sees the prefix exactly as an unpadded one."""
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    if kwargs.get("position_ids") is not None or len(args) > 2 or mask is None or mask.dim() != 2 or bool(mask.all()):
        return None
    tokens = kwargs.get("input_ids", args[0] if args else None)
    if tokens is None:
        tokens = kwargs["inputs_embeds"]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -tokens.shape[1]:]
    return args, {**kwargs, "position_ids": positions}


def _prefix_modules(model):
    return [getattr(m, _PREFIX_ATTR) for m in _attention_layers(model)]


def _eager_attention(attn):
    fn = getattr(importlib.import_module(type(attn).__module__), "eager_attention_forward", None)
    if fn is None:
        raise ValueError(f"{type(attn).__name__} has no eager_attention_forward; use attn_implementation='sdpa'")
    return fn


@contextmanager
def _seeded(seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
