"""Checks the statistics of `tracejudge compare` and the canary gate by simulation
(`tracejudge.collector.history.cohort_stats`).

1. The gate checked repeatedly while a canary runs: two cohorts of conversations arrive one pair at a time (pass
   with probability p_a and p_b); the gate is checked every `--every` conversations per cohort up to `--max-n`.
   - false alarms: the candidate is worse by exactly the margin (the boundary: "fail" is then a false alarm only in
     the wider sense that it is not worse by *more*), and equal (A/A): how often the gate ever says "fail";
   - the same for a fixed-n Newcombe interval checked at every look (what peeking does to a fixed-n test);
   - power: the candidate is worse by twice the margin: how often and how soon the gate fails it;
   - A/A: how often and how soon it passes.
2. Coverage of the Wilson interval (one rate) and Newcombe's interval (a difference) at fixed n.
3. Weighted estimates under error-heavy sampling (`--sampling`): a population where 10 % of conversations have an
   MCP error (they pass 30 % of the time, the others 90 %: true pass rate 0.84); the judge sees every one with an
   error and 5 % of the rest, as `[sampling] rules` would do. Bias, RMSE and the coverage of the Wilson interval on
   Kish's effective sample size, for the Hajek estimate the collector reports and for the sample's own rate.

    python bench/compare.py [--runs 2000] [--margin 0.05] [--every 25] [--max-n 2000]
    python bench/compare.py --sampling [--runs 1000] [--population 20000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracejudge.collector.history.cohort_stats import gate, rate_difference, wilson  # noqa: E402


def canary(p_a: float, p_b: float, args: argparse.Namespace, rng: random.Random) -> tuple[str, int, bool]:
    """(the gate's first decision, the n per cohort it came at, whether a peeked fixed-n interval ever said fail)."""
    passes_a = passes_b = 0
    peeked_fail = False
    for n in range(1, args.max_n + 1):
        passes_a += rng.random() < p_a
        passes_b += rng.random() < p_b
        if n % args.every:
            continue
        decision = gate(passes_a, n, passes_b, n, args.margin, args.alpha)
        fixed = rate_difference(passes_a, n, passes_b, n, 1 - args.alpha)
        peeked_fail = peeked_fail or (fixed.high is not None and fixed.high < -args.margin)
        if decision.outcome != "undecided":
            return decision.outcome, n, peeked_fail
    return "undecided", args.max_n, peeked_fail


def scenario(name: str, p_a: float, p_b: float, args: argparse.Namespace, rng: random.Random) -> None:
    outcomes = [canary(p_a, p_b, args, rng) for _ in range(args.runs)]
    share = {o: sum(1 for x, _, _ in outcomes if x == o) / args.runs for o in ("fail", "pass", "undecided")}
    decided = [n for x, n, _ in outcomes if x != "undecided"]
    peeked = sum(1 for _, _, p in outcomes if p) / args.runs
    when = f", median n {statistics.median(decided):.0f}" if decided else ""
    print(f"  {name:34} gate: fail {share['fail']:6.1%}  pass {share['pass']:6.1%}  undecided "
          f"{share['undecided']:6.1%}{when};  peeked fixed-n interval ever fails {peeked:6.1%}")


def coverage(args: argparse.Namespace, rng: random.Random) -> None:
    for p, n in ((0.9, 50), (0.9, 400), (0.5, 100), (0.98, 200)):
        hits = diff_hits = 0
        for _ in range(args.runs):
            x, y = sum(rng.random() < p for _ in range(n)), sum(rng.random() < p - 0.05 for _ in range(n))
            w = wilson(x, n)
            hits += w.low <= p <= w.high  # type: ignore[operator]
            d = rate_difference(x, n, y, n)
            diff_hits += d.low <= -0.05 <= d.high  # type: ignore[operator]
        print(f"  p={p}, n={n}: Wilson covers {hits / args.runs:.1%}; Newcombe (difference -0.05) covers "
              f"{diff_hits / args.runs:.1%}")


def weighted_sampling(args: argparse.Namespace, rng: random.Random) -> None:
    truth_rates, rows = [], {"hajek": [], "unweighted": []}
    for _ in range(args.runs):
        population = []
        for _ in range(args.population):
            error = rng.random() < 0.1
            population.append((error, rng.random() < (0.3 if error else 0.9)))
        truth = sum(p for _, p in population) / len(population)
        truth_rates.append(truth)
        sample = [(1.0 if error else 0.05, passed) for error, passed in population
                  if rng.random() < (1.0 if error else 0.05)]
        weights = [1 / p for p, _ in sample]
        total = sum(weights)
        hajek = sum(w for w, (_, passed) in zip(weights, sample, strict=True) if passed) / total
        ess = total * total / sum(w * w for w in weights)
        plain = sum(passed for _, passed in sample) / len(sample)
        for name, value, n in (("hajek", hajek, ess), ("unweighted", plain, len(sample))):
            w = wilson(value * n, n)
            rows[name].append((value - truth, w.low <= truth <= w.high))  # type: ignore[operator]
    print(f"error-heavy sampling: population {args.population:,}, true pass rate {statistics.mean(truth_rates):.3f}, "
          f"{args.runs} replications")
    for name, values in rows.items():
        bias = statistics.mean(e for e, _ in values)
        rmse = statistics.mean(e * e for e, _ in values) ** 0.5
        covered = sum(c for _, c in values) / len(values)
        print(f"  {name:10} bias {bias:+.4f}  RMSE {rmse:.4f}  95% Wilson interval covers {covered:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--every", type=int, default=25, help="conversations per cohort between checks")
    parser.add_argument("--max-n", type=int, default=2000, help="conversations per cohort at most")
    parser.add_argument("--base-rate", type=float, default=0.9)
    parser.add_argument("--sampling", action="store_true", help="check the weighted estimates instead")
    parser.add_argument("--population", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(11)
    if args.sampling:
        weighted_sampling(args, rng)
        return
    started = time.perf_counter()
    p, m = args.base_rate, args.margin
    print(f"canary gate, margin {m}, alpha {args.alpha}, checked every {args.every} up to {args.max_n} per cohort, "
          f"{args.runs} runs per scenario")
    scenario(f"worse by the margin ({p} vs {p - m:.2f})", p, p - m, args, rng)
    scenario(f"A/A ({p} vs {p})", p, p, args, rng)
    scenario(f"worse by twice the margin ({p} vs {p - 2 * m:.2f})", p, p - 2 * m, args, rng)
    scenario(f"better by the margin ({p - m:.2f} vs {p})", p - m, p, args, rng)
    print("fixed-n intervals")
    coverage(args, rng)
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
