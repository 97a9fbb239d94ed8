"""Where a run's memory goes: the process's RSS sampled every 50 ms while ``mezo-rl ARGS`` runs in this process.

    OMP_NUM_THREADS=1 MEZO_RL_DATA=DIR python benchmarks/rss_timeline.py --out FILE.json -- train --task sst2 \\
        --peft full --dtype bfloat16 --autocast none --max-steps 4 --eval-steps 2 --no-progress --output-dir DIR

The baseline is the RSS after importing what ``mezo-rl train`` imports, before any model loads (as
``benchmarks/bf16_outcomes.py`` measures it). Prints the baseline and the peak; ``--out`` gets the timeline, one
``[seconds, MiB]`` point each time the RSS moved by more than 20 MiB, so the load, the evaluations and the steps
show as steps and swings of the curve.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args, rest = ap.parse_known_args()
    rest = [a for a in rest if a != "--"]
    import mezo_rl.cli.main
    import mezo_rl.training.trainer  # noqa: F401 - what `mezo-rl train` imports, before the baseline is read
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0, points = time.time(), []

    def sample():
        while True:
            points.append((round(time.time() - t0, 2), round(rss_mib(), 1)))
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    try:
        mezo_rl.cli.main.main(rest)
    except SystemExit:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kept, last = [], float("-inf")
    for t, r in points:
        if abs(r - last) > 20:
            kept.append((t, r))
            last = r
    with open(args.out, "w") as f:
        json.dump(dict(argv=rest, baseline_mib=round(baseline, 1), peak_mib=round(peak, 1), timeline=kept), f)
    print(json.dumps(dict(baseline_mib=round(baseline, 1), peak_mib=round(peak, 1),
                          above_baseline_mib=round(peak - baseline, 1))))


if __name__ == "__main__":
    sys.exit(main())
