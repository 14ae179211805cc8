"""Checks the judge-agreement estimator (`tracejudge.collector.history.agreement`) by simulation: is the weighted
kappa unbiased for all traffic when a review queue over-samples failures, and do its percentile-bootstrap intervals
cover the true kappa as often as they say?

A population of conversations has a human verdict (pass with `--human-pass`) and a judge verdict that agrees with
it with `--agree` (so the true kappa is known, computed on the population itself). A queue reviews each
conversation the judge failed with probability `--p-fail` and every other one with `--p-other` (Poisson
sampling, as the collector's queue rules do), recording that probability. Each replication estimates kappa from
the reviewed items, weighted (1 / probability) and unweighted, with a 95 % interval.

Run: `python bench/agreement.py [--replications 300] [--population 20000]`; prints bias, RMSE and coverage.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracejudge.collector.history.agreement import agreement  # noqa: E402


def population(size: int, human_pass: float, agree: float, rng: random.Random) -> list[tuple[bool, bool]]:
    out = []
    for _ in range(size):
        human = rng.random() < human_pass
        out.append((human if rng.random() < agree else not human, human))
    return out


def true_kappa(items: list[tuple[bool, bool]]) -> float:
    estimate = agreement([j for j, _ in items], [h for _, h in items], resamples=0)
    assert estimate.kappa.value is not None
    return estimate.kappa.value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replications", type=int, default=300)
    parser.add_argument("--population", type=int, default=20_000)
    parser.add_argument("--human-pass", type=float, default=0.7)
    parser.add_argument("--agree", type=float, default=0.85)
    parser.add_argument("--p-fail", type=float, default=0.05, help="review probability of a judged failure")
    parser.add_argument("--p-other", type=float, default=0.005, help="review probability of any other conversation")
    parser.add_argument("--resamples", type=int, default=400, help="bootstrap resamples per interval")
    args = parser.parse_args()
    rng = random.Random(7)
    items = population(args.population, args.human_pass, args.agree, rng)
    truth = true_kappa(items)
    started = time.perf_counter()
    rows: dict[str, list[tuple[float, bool]]] = {"weighted": [], "unweighted": []}
    sizes = []
    for r in range(args.replications):
        chosen = [(j, h, args.p_fail if not j else args.p_other) for j, h in items
                  if rng.random() < (args.p_fail if not j else args.p_other)]
        sizes.append(len(chosen))
        judge, human, probability = [c[0] for c in chosen], [c[1] for c in chosen], [c[2] for c in chosen]
        for name, p in (("weighted", probability), ("unweighted", None)):
            k = agreement(judge, human, p, resamples=args.resamples, seed=r).kappa
            if k.value is not None and k.low is not None and k.high is not None:
                rows[name].append((k.value - truth, k.low <= truth <= k.high))
    print(f"population {args.population:,}, human pass rate {args.human_pass}, judge agrees {args.agree}: "
          f"true kappa {truth:.3f}")
    print(f"queue: judged failures reviewed with p={args.p_fail}, others with p={args.p_other}: "
          f"{statistics.mean(sizes):.0f} reviews per replication (min {min(sizes)}), {args.replications} replications, "
          f"{args.resamples} bootstrap resamples, {time.perf_counter() - started:.0f} s")
    for name, values in rows.items():
        errors = [e for e, _ in values]
        bias = statistics.mean(errors)
        rmse = statistics.mean(e * e for e in errors) ** 0.5
        coverage = sum(c for _, c in values) / len(values)
        print(f"  {name:10}  bias {bias:+.3f}  RMSE {rmse:.3f}  95% interval covers the truth {coverage:.1%}")


if __name__ == "__main__":
    main()
