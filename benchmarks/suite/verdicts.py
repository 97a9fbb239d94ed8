"""The paper's claims, decided from the measured groups alone (pure functions)."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .plan import MEZO_ANY_CE, MEZO_CE, METHODS, method_label, task_order
from .stats import Group


@dataclasses.dataclass
class Verdict:
    claim: str
    task: str
    model: str
    verdict: str          # "holds" | "does not hold" | "inconclusive" | "not measured"
    detail: str


HOLDS, FAILS, MISSING = "holds", "does not hold", "not measured"
INCONCLUSIVE = "inconclusive"   # a closeness claim whose methods did not move off zero-shot: close by standing still
Z = 2.0          # "well above": the difference exceeds 2 standard errors
TOLERANCE = 0.05  # "within 5 points" / "comparable": 5 accuracy (or F1) points


def _diff(a: Group, b: Group) -> tuple[float, float]:
    se = math.sqrt((a.se or 0.0) ** 2 + (b.se or 0.0) ** 2)
    return a.mean - b.mean, se


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _name(g: Group) -> str:
    s = method_label(g.method, g.task)
    return s + (f" ({g.steps} steps)" if g.steps else "")


def _best(groups: list[Group]) -> Optional[Group]:
    return max(groups, key=lambda g: g.mean) if groups else None


def _above(claim, task, model, a: Optional[Group], b: Optional[Group], what_b: str) -> Verdict:
    if a is None or b is None:
        missing = [w for w, g in ((("MeZO" if claim.startswith("MeZO") else "the objective"), a), (what_b, b)) if g is None]
        return Verdict(claim, task, model, MISSING, " and ".join(missing) + " not measured")
    d, se = _diff(a, b)
    ok = d > Z * se
    return Verdict(claim, task, model, HOLDS if ok else FAILS,
                   f"{_name(a)} {100 * a.mean:.1f} vs {what_b} {100 * b.mean:.1f}: {_pts(d)} points "
                   f"(SE {100 * se:.1f}; {'>' if ok else '<='} {Z:g} SE)")


def _standing_still(groups: list[Group], zero_shot: Optional[Group]) -> str:
    """Why a closeness claim says nothing here: every one of ``groups`` is within 2 SE of zero-shot
    (a method that does not learn is "close" to another that does not). '' when one of them moved
    or zero-shot is not measured."""
    if zero_shot is None or any(_diff(g, zero_shot)[0] > Z * _diff(g, zero_shot)[1] for g in groups):
        return ""
    return "; ".join(f"{_name(g)} {100 * g.mean:.1f} vs zero-shot {100 * zero_shot.mean:.1f}: "
                     f"{_pts(_diff(g, zero_shot)[0])} (SE {100 * _diff(g, zero_shot)[1]:.1f})" for g in groups)


def verdicts(groups: list[Group]) -> list[Verdict]:
    """The paper's claims, decided from the measured groups (never from anything else).

    * MeZO well above zero-shot / ICL: the best MeZO cross-entropy variant (full, LoRA, prefix, as
      the paper reports the best of the three, or the final norm) exceeds it by more than 2 standard errors.
    * full, LoRA and prefix comparable: the largest gap between the measured ones is <= 5 points.
    * accuracy/F1 objective well above zero-shot: by more than 2 standard errors.
    * MeZO within 5 points of FT: best MeZO (CE) >= FT - 5 points; reported with the steps it took.

    The two closeness claims are "inconclusive" when none of the methods compared is more than 2 SE
    above zero-shot: then they agree only because none of them learned the task.
    """
    out = []
    by = {}
    for g in groups:
        by.setdefault((g.task, g.model), []).append(g)
    for (task, model), gs in sorted(by.items(), key=lambda kv: (task_order(kv[0][0]), kv[0][1])):
        pick = {m: _best([g for g in gs if g.method == m]) for m in METHODS}
        mezo = _best([g for g in gs if g.method in MEZO_ANY_CE])
        out.append(_above("MeZO well above zero-shot", task, model, mezo, pick["zero-shot"], "zero-shot"))
        out.append(_above("MeZO well above ICL", task, model, mezo, pick["icl"], "ICL"))
        modes = [pick[m] for m in MEZO_CE if pick[m] is not None]
        claim = "MeZO full / LoRA / prefix comparable"
        if len(modes) < 2:
            out.append(Verdict(claim, task, model, MISSING,
                               f"{len(modes)} of the 3 modes measured" + (f" ({_name(modes[0])})" if modes else "")))
        else:
            hi, lo = max(modes, key=lambda g: g.mean), min(modes, key=lambda g: g.mean)
            d, se = _diff(hi, lo)
            ok = d <= TOLERANCE
            missing = [METHODS[m].label for m in MEZO_CE if pick[m] is None]
            still = _standing_still(modes, pick["zero-shot"])
            out.append(Verdict(claim, task, model, INCONCLUSIVE if still else HOLDS if ok else FAILS,
                               (f"none moved off zero-shot ({still}); " if still else "") + f"largest gap {_name(hi)} {100 * hi.mean:.1f} vs {_name(lo)} {100 * lo.mean:.1f}: "
                               f"{100 * d:.1f} points (SE {100 * se:.1f}; tolerance {100 * TOLERANCE:g})"
                               + (f"; not measured: {', '.join(missing)}" if missing else "")))
        out.append(_above("accuracy/F1 objective well above zero-shot", task, model, pick["mezo-metric"],
                          pick["zero-shot"], "zero-shot"))
        claim = "MeZO within 5 points of FT"
        ft = pick["ft"]
        ce = [g for g in gs if g.method in MEZO_ANY_CE]
        if ft is None or not ce:
            out.append(Verdict(claim, task, model, MISSING,
                               " and ".join(w for w, g in (("MeZO", ce), ("FT", ft)) if not g) + " not measured"))
        else:
            close = sorted((g for g in ce if g.mean >= ft.mean - TOLERANCE), key=lambda g: (g.steps or 0, -g.mean))
            ft_steps = f" ({ft.steps} steps of {ft.batch})" if ft.steps else ""
            if close:
                g = close[0]
                verdict, detail = HOLDS, (f"{_name(g)} {100 * g.mean:.1f} vs FT{ft_steps} {100 * ft.mean:.1f}: "
                                          f"{_pts(g.mean - ft.mean)} points, first at {g.steps} MeZO steps")
            else:
                g = _best(ce)
                d, se = _diff(g, ft)
                verdict, detail = FAILS, (f"best {_name(g)} {100 * g.mean:.1f} vs FT{ft_steps} {100 * ft.mean:.1f}: "
                                          f"{_pts(d)} points (SE {100 * se:.1f}); most MeZO steps measured: "
                                          f"{max(x.steps or 0 for x in ce)}")
            still = _standing_still([g, ft], pick["zero-shot"])
            out.append(Verdict(claim, task, model, INCONCLUSIVE if still else verdict,
                               (f"neither moved off zero-shot ({still}); " if still else "") + detail))
    return out


