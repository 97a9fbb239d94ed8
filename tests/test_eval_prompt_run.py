"""`mezo-rl eval --run-dir RUN` on a prompt-task run: the run's rewards (mean, SE, n) and kl on the split, as
JSON (issue 35: it used to end in a traceback)."""
from __future__ import annotations

import json

from mezo_rl.cli.main import main

WORDS = ["the movie was", "a film about", "the acting is", "this story has", "the plot was", "an ending that"]
REWARD = '''
def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]
'''


def test_eval_run_dir_on_a_prompt_run_reports_its_rewards_and_kl(tmp_path, tiny_model_dir, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{WORDS[i % 6]} {i}"}) + "\n" for i in range(40)))
    (tmp_path / "rewards.py").write_text(REWARD)
    run = tmp_path / "run"
    assert main(["train", "--model", str(tiny_model_dir), "--task", str(prompts), "--reward",
                 f"{tmp_path / 'rewards.py'}:reward_len", "--peft", "lora", "--max-steps", "2", "--eval-steps", "2",
                 "--per-device-train-batch-size", "4", "--num-train", "20", "--num-eval", "6",
                 "--max-completion-length", "6", "--learning-rate", "0.5", "--do-sample", "--autocast", "none",
                 "--no-progress", "--output-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    name = next(k for k in summary["test"] if k.endswith(":reward_len"))  # a file reward is named by its reference
    capsys.readouterr()
    for step, expected in (("0", summary["initial_test"]), ("final", None)):
        assert main(["eval", "--run-dir", str(run), "--split", "test", "--step", step, "--max-completion-length", "6"]) == 0
        out = json.loads(capsys.readouterr().out)
        metrics = out["metrics"]
        assert out["n"] == summary["test"]["n"] and {name, f"{name}/se", "objective", "kl", "n"} <= set(metrics)
        if expected is not None:  # the starting weights: what the run measured before its first step, and kl 0
            assert metrics["kl"] == 0.0
            assert metrics[name] == expected[name]
    # the final weights moved: a positive kl, and the same figure as the run's own test evaluation where it
    # tested them
    assert metrics["kl"] > 0
    if summary["best_step"] == 2:
        assert metrics["kl"] == summary["test"]["kl"]
