"""Whether an RL gain games its scorer: the base model's log-likelihood of the completions and their
distinct-2, before and after training, each change with its standard error (the same test prompts,
paired). One implementation for the MeZO and the TRL GRPO cells (benchmarks/rl.py, grpo_sentiment.py)."""
from __future__ import annotations

import json
import math
import random

from mezo_rl.stats import Moments

#: resamples of the paired bootstrap that gives distinct-2's change its SE (a corpus-level figure has no
#: per-prompt value to average); the bootstrap's own relative error in that SE is about 1 / sqrt(2 B), 2%
DISTINCT_BOOTSTRAP = 1000

_BASE: dict = {}


def base_logliks(prompts: list, completions: list[str], model="smollm2-135m") -> list:
    """Each completion's mean log-likelihood per token under the untrained ``model`` (a name, loaded once, or
    a loaded :class:`mezo_rl.model.lm.LanguageModel`) given its prompt (a chat prompt, a list of messages,
    read as the chat template renders it for generation); None for an empty completion."""
    import torch

    if isinstance(model, str):
        if model not in _BASE:
            from mezo_rl.model.loading import load_model
            _BASE[model] = load_model(model)
        model = _BASE[model]
    lm = model
    prompts = [p if isinstance(p, str) else lm.tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
               for p in prompts]
    kept = [i for i, c in enumerate(completions) if c.strip()]
    with torch.no_grad():
        scores = lm.score([prompts[i] for i in kept], [[completions[i]] for i in kept])
    out: list = [None] * len(completions)
    for i, s in zip(kept, scores):
        out[i] = float(s.mean[0])
    return out


def hacking_measures(before: list[dict], after: list[dict], model="smollm2-135m") -> dict:
    """From the test samples (``prompt``, ``completion``) before and after training:

    - ``before`` / ``after``: the completions' mean base-model log-likelihood per token, ``n`` samples;
    - ``change`` / ``change_se`` / ``change_n``: its mean per-prompt change and that mean's SE, over the
      prompts whose two completions are both non-empty;
    - ``distinct_2_change`` / ``distinct_2_change_se``: distinct-2 of the completions after - before, and the
      SE of a paired bootstrap over the prompts (``DISTINCT_BOOTSTRAP`` resamples, a fixed seed).
    The changes are left out unless the two lists hold the same prompts."""
    from mezo_rl.training.evaluation import distinct_n

    out: dict = {}
    values = {}
    for when, samples in (("before", before), ("after", after)):
        if samples:
            values[when] = base_logliks([s["prompt"] for s in samples], [s["completion"] for s in samples], model)
            out[when] = Moments.of(v for v in values[when] if v is not None).mean
            out["n"] = len(samples)
    if len(values) < 2 or len(before) != len(after):
        return out
    index = {json.dumps(s["prompt"]): i for i, s in enumerate(before)}
    pairs = [(index.get(json.dumps(s["prompt"])), j) for j, s in enumerate(after)]
    if any(i is None for i, _ in pairs):
        return out
    diffs = Moments.of(values["after"][j] - values["before"][i] for i, j in pairs
                       if values["after"][j] is not None and values["before"][i] is not None)
    out.update(change=diffs.mean, change_se=diffs.se, change_n=diffs.count)
    texts = [(before[i]["completion"], after[j]["completion"]) for i, j in pairs]
    rng = random.Random(0)
    boot = []
    for _ in range(DISTINCT_BOOTSTRAP):
        pick = [texts[rng.randrange(len(texts))] for _ in texts]
        d = distinct_n([a for _, a in pick]) - distinct_n([b for b, _ in pick])
        if not math.isnan(d):
            boot.append(d)
    out["distinct_2_change"] = distinct_n([a for _, a in texts]) - distinct_n([b for b, _ in texts])
    out["distinct_2_change_se"] = Moments.of(boot).std()
    return out
