"""Checks the judge-agreement estimator (`tracejudge.collector.history.agreement`) by simulation: is the weighted
kappa unbiased for all traffic when a review queue over-samples failures, and do its percentile-bootstrap intervals
cover the true kappa as often as they say?

A population of conversations has a human verdict (pass with `--human-pass`) and a judge verdict that agrees with
it with `--agree` (so the true kappa is known, computed on the population itself). A queue reviews each
conversation the judge failed with probability `--p-fail` and every other one with `--p-other` (Poisson
sampling, as the collector's queue rules do), recording that probability. Each replication estimates kappa from
the reviewed items, weighted (1 / probability) and unweighted, with a 95 % interval.

Run: `python bench/agreement.py [--replications 300] [--population 20000]`; prints bias, RMSE and coverage.

`--all-figures` checks every figure the Agreement page shows the same way: each conversation also has a judge
score (agreeing verdicts score on their side of 0.5), a reviewer's score (the judge's, off by N(0, 0.15)), three
tasks whose verdict pairs agree with `--agree`, and a second reviewer who agrees with the first 90 % of the time;
the truth of each figure is computed on the population. `--time-report N` times the agreement report (every
figure, 1,000 resamples) of N stored reviews in a DuckDB file, the first call and a cached one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracejudge.collector.history.agreement import (  # noqa: E402
    FullAgreement,
    ReviewedItem,
    agreement,
    full_agreement,
)


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


def rich_population(size: int, human_pass: float, agree: float, rng: random.Random) -> list[ReviewedItem]:
    out = []
    for judge, human in population(size, human_pass, agree, rng):
        score = rng.uniform(0.5, 1.0) if judge else rng.uniform(0.0, 0.5)
        tasks = []
        for _ in range(3):
            task_human = rng.random() < human_pass
            tasks.append((task_human if rng.random() < agree else not task_human, task_human))
        out.append(ReviewedItem(judge, human, 1.0, score, min(1.0, max(0.0, score + rng.gauss(0, 0.15))),
                                tuple(tasks), (), human if rng.random() < 0.9 else not human))
    return out


def check_all_figures(args: argparse.Namespace, rng: random.Random) -> None:
    items = rich_population(args.population, args.human_pass, args.agree, rng)
    truth = full_agreement(items, resamples=0)
    names = [n for n in FullAgreement.__dataclass_fields__ if getattr(truth, n).value is not None]
    errors: dict[str, list[tuple[float, bool]]] = {n: [] for n in names}
    started = time.perf_counter()
    for r in range(args.replications):
        chosen = [ReviewedItem(i.judge_pass, i.human_pass, p, i.judge_score, i.human_score, i.tasks, (),
                               i.second_human_pass)
                  for i in items for p in [args.p_fail if not i.judge_pass else args.p_other] if rng.random() < p]
        estimate = full_agreement(chosen, resamples=args.resamples, seed=r)
        for name in names:
            e, t = getattr(estimate, name), getattr(truth, name).value
            if e.value is not None and e.low is not None:
                errors[name].append((e.value - t, e.low <= t <= e.high))
    print(f"every figure, weighted, {args.replications} replications, {args.resamples} resamples, "
          f"{time.perf_counter() - started:.0f} s")
    for name in names:
        values = errors[name]
        bias = statistics.mean(e for e, _ in values)
        rmse = statistics.mean(e * e for e, _ in values) ** 0.5
        print(f"  {name:15} truth {getattr(truth, name).value:.3f}  bias {bias:+.3f}  RMSE {rmse:.3f}  "
              f"covers {sum(c for _, c in values) / len(values):.1%}")


def time_report(reviews: int) -> None:
    import json
    import tempfile

    import duckdb

    from tracejudge.collector.review.reviews import AgreementCache
    from tracejudge.collector.store.schema import migrate

    rng = random.Random(3)
    with tempfile.TemporaryDirectory() as folder:
        con = duckdb.connect(str(Path(folder) / "reviews.duckdb"))
        migrate(con)
        rows = []
        for i in range(reviews):
            judge, human = rng.random() < 0.6, rng.random() < 0.6
            labels = {"tasks": [{"index": t, "judge_pass": rng.random() < 0.6, "human_pass": rng.random() < 0.6}
                                for t in range(3)]}
            rows.append((f"r{i}", f"conv-{i // 2}", 1, "mcp_use", "cfg", f"reviewer-{i % 2}", "agree", human,
                         rng.random(), None, "random", 0.05, rng.random(), judge, "judge", json.dumps(labels)))
        con.executemany("INSERT INTO reviews (review_id, conversation_id, conversation_version, metric, "
                        "metric_config, reviewer, verdict, human_pass, human_score, note, queue_rule, "
                        "sampling_probability, judge_score, judge_success, judge_model, labels, reviewed_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now())", rows)
        cache = AgreementCache()
        started = time.perf_counter()
        cache.report(con)
        first = time.perf_counter() - started
        started = time.perf_counter()
        cache.report(con)
        print(f"agreement report of {reviews:,} reviews (3 labelled tasks each, 2 reviewers per item): "
              f"{first:.2f} s, then {time.perf_counter() - started:.4f} s cached")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replications", type=int, default=300)
    parser.add_argument("--population", type=int, default=20_000)
    parser.add_argument("--human-pass", type=float, default=0.7)
    parser.add_argument("--agree", type=float, default=0.85)
    parser.add_argument("--p-fail", type=float, default=0.05, help="review probability of a judged failure")
    parser.add_argument("--p-other", type=float, default=0.005, help="review probability of any other conversation")
    parser.add_argument("--resamples", type=int, default=400, help="bootstrap resamples per interval")
    parser.add_argument("--all-figures", action="store_true", help="check every figure of the Agreement page")
    parser.add_argument("--time-report", type=int, metavar="N", help="time the agreement report of N reviews")
    args = parser.parse_args()
    rng = random.Random(7)
    if args.time_report:
        time_report(args.time_report)
        return
    if args.all_figures:
        check_all_figures(args, rng)
        return
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
