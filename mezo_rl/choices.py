"""What the options accept, declared once: the configuration (:mod:`mezo_rl.training.arguments`) reads these
without importing the machinery, and the machinery that acts on a value imports the same names.

- the engine's: :data:`NOISES`, :data:`ESTIMATORS`, :data:`MEMBER_EVALUATIONS`, :data:`ON_NONFINITE`, :data:`ROUNDINGS`,
  :data:`HIZOO_OPTIONS`;
- the weights' dtypes: :data:`DTYPES`, :data:`LOW_PRECISION_DTYPES`, :func:`check_dtype`; which member evaluation
  serves which run: :func:`check_member_evaluation`;
- how a next token is chosen: :class:`Sampling` (its knobs, :data:`SAMPLING_FIELDS`, and their bounds);
- where metrics go: :data:`INTEGRATIONS`, :data:`REPORT_TO`, :func:`check_report_to`; when the Hub gets the
  weights: :data:`HUB_STRATEGIES`; per-device memory caps: :func:`parse_max_memory`.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Optional

import torch

from mezo_rl.errors import ConfigError, UserError

__all__ = ["NOISES", "ESTIMATORS", "MEMBER_EVALUATIONS", "ON_NONFINITE", "ROUNDINGS", "HIZOO_OPTIONS", "DTYPES",
           "LOW_PRECISION_DTYPES", "bf16_is_native", "weights_dtype", "check_dtype", "check_member_evaluation", "serves_low_precision", "Sampling", "SAMPLING_FIELDS", "INTEGRATIONS",
           "REPORT_TO", "check_report_to", "HUB_STRATEGIES", "parse_max_memory"]

# ---------------------------------------------------------------------- the engine
#: every noise an optimizer can use: the element-wise kinds, then low-rank matrices
NOISES = ("gaussian", "rademacher", "lowrank")
#: MeZO's ``estimator``, ``member_evaluation`` and ``on_nonfinite``
ESTIMATORS = ("two_point", "one_point", "es")
MEMBER_EVALUATIONS = ("inplace", "batched")
ON_NONFINITE = ("raise", "skip")
#: how an update is written into bf16 / fp16 weights
ROUNDINGS = ("stochastic", "nearest")
#: what ``hessian_smooth`` > 0 (HiZOO's curvature) needs of the other run options
HIZOO_OPTIONS = dict(estimator="two_point", noise="lowrank", rank=1)

# ---------------------------------------------------------------------- the weights
#: the weights' dtypes a run may ask for (``--dtype``), and those an update is rounded into (bf16 / fp16)
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOW_PRECISION_DTYPES = ("bfloat16", "float16")


def bf16_is_native() -> bool:
    """True where bf16 matrix products run natively (CUDA, or a CPU with AVX512-BF16 or AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def weights_dtype(dtype: str, autocast_mode: str = "auto", recorded: Optional[str] = None,
                  serves_low: bool = True) -> str:
    """The weights' dtype ``--dtype`` asks for: itself, or for ``"auto"`` the ``recorded`` one (the dtype a recorded
    run's weights were written with), else bfloat16 where bf16 is native, ``--autocast`` is auto (a run that turned
    autocast off or asked for fp32 master weights keeps float32) and the run's members can be evaluated on
    low-precision weights (``serves_low``: :func:`serves_low_precision`)."""
    if dtype != "auto":
        return dtype
    if recorded is not None:
        return recorded
    return "bfloat16" if autocast_mode == "auto" and serves_low and bf16_is_native() else "float32"


def check_dtype(dtype: str, autocast_mode: str) -> None:
    """Refuse, in one line before any model loads, weights this machine cannot hold or a pair that means nothing."""
    cuda = torch.cuda.is_available()
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: accepted: {', '.join(DTYPES)}")
    if dtype == "float16" and not cuda:
        raise ConfigError("--dtype float16 needs a CUDA device (a CPU computes float16 slowly and without its "
                          "range checks); use bfloat16 or float32 here")
    if dtype == "bfloat16" and cuda and not torch.cuda.is_bf16_supported():
        raise ConfigError("--dtype bfloat16: this GPU has no bf16 support; use float16 or float32")
    if dtype in LOW_PRECISION_DTYPES and autocast_mode == "bfloat16":
        raise ConfigError(f"--dtype {dtype} with --autocast bfloat16: autocast keeps float32 master weights and "
                          f"computes in bf16, and {dtype} weights already compute in their own dtype; give one of "
                          "them (--autocast auto or none with low-precision weights)")


def _perturbs_every_matrix(peft: str, noise: Optional[str], trainable: Optional[str]) -> bool:
    """Every matrix trained with element-wise noise: the batched mode would need a copy of each per member."""
    return peft in ("full", "none") and trainable is None and noise not in ("lowrank", None)


def serves_low_precision(evaluation: str, peft: str, noise: Optional[str], trainable: Optional[str]) -> bool:
    """Whether a run's members can be evaluated on bf16 / fp16 weights: batched (``auto`` picks it for them), which
    never perturbs the weights, and the mode can serve the run (not every matrix with element-wise noise)."""
    return evaluation != "inplace" and not _perturbs_every_matrix(peft, noise, trainable)


def check_member_evaluation(evaluation: str, peft: str, noise: str, trainable: Optional[str],
                            weights: Optional[str] = None) -> None:
    """Refuse, before any model loads, what the batched mode cannot serve (one line, ConfigError), and the
    in-place mode for bf16 / fp16 ``weights`` (the weights' dtype, ``auto`` resolved; None: not known yet): a
    perturbation swept into them rounds, and its restore does not return them bit for bit. ``noise`` None (the
    mode's default, low-rank where every matrix is trained) perturbs activation-side."""
    whole = _perturbs_every_matrix(peft, noise, trainable)
    if weights in LOW_PRECISION_DTYPES and not serves_low_precision(evaluation, peft, noise, trainable):
        raise ConfigError(f"--dtype {weights}: a step must evaluate its members batched (the in-place sweeps would "
                          "round the weights and not restore them), "
                          + ("not --member-evaluation inplace" if evaluation == "inplace" else
                             f"which perturbs every matrix activation-side and needs --noise lowrank, got --noise {noise}")
                          + "; or use --dtype float32")
    if evaluation == "batched" and whole:
        raise ConfigError(f"--member-evaluation batched perturbs the model's matrices activation-side, which needs "
                          f"--noise lowrank (the default of --peft full), got --noise {noise}; "
                          "or use --member-evaluation inplace")


# ---------------------------------------------------------------------- decoding
@dataclass(frozen=True)
class Sampling:
    """How a next token is chosen from the logits, as transformers' ``generate`` and TRL's ``GRPOConfig`` name the
    knobs, applied in transformers' order: ``repetition_penalty`` (every token already in the row, prompt
    included: a positive logit divided by it, a negative one multiplied; greedy decoding too), then, when
    sampling, ``temperature``, ``top_k`` (the k most likely; 0 or None: all), ``top_p`` (the smallest set whose
    probability reaches it), ``min_p`` (tokens below ``min_p`` times the most likely one's probability dropped;
    0 or None: none). The neutral values change nothing."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0

    def __post_init__(self):
        bad = [(name, accepted) for name, ok, accepted in (
            ("temperature", self.temperature > 0, "a number > 0"),
            ("top_p", 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("top_k", self.top_k is None or (int(self.top_k) == self.top_k and self.top_k >= 0), "an integer >= 0"),
            ("min_p", self.min_p is None or 0 <= self.min_p <= 1, "a number in [0, 1]"),
            ("repetition_penalty", self.repetition_penalty > 0, "a number > 0")) if not ok]
        if bad:
            raise ValueError("; ".join(f"{name}: got {getattr(self, name)!r}, accepted: {accepted}"
                                       for name, accepted in bad))

    @property
    def penalises(self) -> bool:
        return self.repetition_penalty != 1.0


#: the sampling options, as :class:`Sampling` takes them (``generation_kwargs`` may set these)
SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(Sampling))

# ---------------------------------------------------------------------- outputs
#: ``report_to`` names -> (the module it needs, the mezo-rl extra that installs it)
INTEGRATIONS = {"tensorboard": ("tensorboard", "tensorboard"), "trackio": ("trackio", "trackio"),
                "wandb": ("wandb", "wandb")}
REPORT_TO = ("none", "all", *INTEGRATIONS)
#: ``hub_strategy``, as in transformers
HUB_STRATEGIES = ("every_save", "end", "checkpoint")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_report_to(report_to) -> list[str]:
    """The integrations ``report_to`` names (``"none"`` / ``[]``: none; ``"all"``: every installed one), each
    checked: an unknown name, or one whose package is missing, is a :class:`~mezo_rl.errors.UserError` naming
    it and what to do."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    names = [n.strip() for name in names for n in str(name).split(",") if n.strip()]
    unknown = [n for n in names if n not in REPORT_TO]
    if unknown:
        raise ConfigError(f"--report-to: got {unknown[0]!r}, accepted: {', '.join(REPORT_TO)}")
    if "none" in names:
        if len(names) > 1:
            raise ConfigError(f"--report-to: 'none' cannot be combined with {[n for n in names if n != 'none']}")
        return []
    if "all" in names:
        return [n for n, (module, _) in INTEGRATIONS.items() if _installed(module)]
    for name in names:
        module, extra = INTEGRATIONS[name]
        if not _installed(module):
            raise UserError(f"--report-to {name}: the {module} package is not installed; install it with "
                            f"pip install 'mezo-rl[{extra}]' (or leave {name} out of --report-to)")
    return list(dict.fromkeys(names))


def parse_max_memory(spec: str | None) -> dict | None:
    """``"0=20GiB,cpu=60GiB"`` -> ``{0: "20GiB", "cpu": "60GiB"}`` (the form accelerate expects)."""
    if not spec:
        return None
    out = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"--max-memory: cannot read {part!r}; expected DEVICE=SIZE pairs such as '0=20GiB,cpu=60GiB'")
        key = key.strip()
        out[int(key) if key.isdigit() else key] = value.strip()
    return out
