"""How often the judge agrees with people, on reviewed items that a queue chose with known probabilities.

Estimators: each reviewed item weighs the inverse of the probability its queue rule had of choosing it
(Horvitz-Thompson weights), so every proportion below estimates all traffic, not the queue's mix (a queue of
failures alone would overstate how often the judge fails).
- Cohen's kappa and accuracy between the judge's pass/fail and a human's, from weighted proportions;
- mean absolute difference between the judge's score and the score the reviewer would give (where given);
- AUC: the weighted chance that a conversation people passed has a higher judge score than one they failed;
- per task and per call: kappa and accuracy over the labelled tasks or calls, each weighted as its review;
- between reviewers: kappa between the first two reviewers of an item.
Interval: the percentile bootstrap, resampling reviewed conversations (a conversation's reviews, tasks and calls
go with it), so the intervals hold the dependence between the reviews and parts of one conversation
(`bench/agreement.py --all-figures` checks every figure's coverage and bias by simulation). Pure: numbers in,
numbers out.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

DEFAULT_RESAMPLES = 1000
MAX_BOOTSTRAP_WORK = 1_000_000  # items x resamples per statistic: a large review history keeps its answer quick
MIN_INTERVAL_UNITS = 5  # fewer reviewed items than this: every resample is nearly the same, no honest interval
T = TypeVar("T")


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval (None where the data cannot say: no items, or one class only)."""

    value: float | None
    low: float | None
    high: float | None
    n: int


@dataclass(frozen=True)
class Agreement:
    kappa: Estimate
    accuracy: Estimate


@dataclass(frozen=True)
class ReviewedItem:
    """One review as the estimators see it: the judge's and the reviewer's verdicts and scores, the queue's
    sampling probability, the per-task or per-call verdict pairs, and the second reviewer's verdict if any."""

    judge_pass: bool
    human_pass: bool
    probability: float = 1.0
    judge_score: float | None = None
    human_score: float | None = None
    tasks: tuple[tuple[bool, bool], ...] = ()
    calls: tuple[tuple[bool, bool], ...] = ()
    second_human_pass: bool | None = None
    cluster: Hashable | None = None  # the reviewed conversation version: its reviews are resampled together
    weight: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.probability <= 1:
            raise ValueError("a sampling probability must be in (0, 1]")
        object.__setattr__(self, "weight", 1.0 / self.probability)


@dataclass(frozen=True)
class FullAgreement:
    """Every agreement figure of one metric, configuration and judge model, each with its interval and count."""

    kappa: Estimate
    accuracy: Estimate
    mean_abs_diff: Estimate
    auc: Estimate
    task_kappa: Estimate
    task_accuracy: Estimate
    call_kappa: Estimate
    call_accuracy: Estimate
    reviewer_kappa: Estimate


def _kappa_and_accuracy(pairs: Sequence[tuple[bool, bool, float]]) -> tuple[float | None, float | None]:
    total = agreeing = judge_passes = human_passes = 0.0
    for judge, human, w in pairs:  # one pass: this runs once per bootstrap resample
        total += w
        if judge == human:
            agreeing += w
        if judge:
            judge_passes += w
        if human:
            human_passes += w
    if total <= 0:
        return None, None
    observed, judge_pass, human_pass = agreeing / total, judge_passes / total, human_passes / total
    chance = judge_pass * human_pass + (1 - judge_pass) * (1 - human_pass)
    kappa = None if chance >= 1 else (observed - chance) / (1 - chance)
    return kappa, observed


def weighted_auc(scores: Sequence[float], positive: Sequence[bool], weights: Sequence[float]) -> float | None:
    """P(score of a positive > score of a negative) + half the ties, pairs weighted by the product of their
    weights; None without both classes. O(n log n): sorted once, negatives below each score summed as it goes."""
    items = sorted(zip(scores, positive, weights, strict=True))
    total_pos = sum(w for _, p, w in items if p)
    total_neg = sum(w for _, p, w in items if not p)
    if total_pos <= 0 or total_neg <= 0:
        return None
    below, wins, i = 0.0, 0.0, 0
    while i < len(items):
        j = i
        while j < len(items) and items[j][0] == items[i][0]:
            j += 1
        tied = items[i:j]
        pos = sum(w for _, p, w in tied if p)
        neg = sum(w for _, p, w in tied if not p)
        wins += pos * (below + neg / 2)
        below += neg
        i = j
    return wins / (total_pos * total_neg)


def bootstrap(units: Sequence[T], statistic: Callable[[Sequence[T]], float | None], *,
              resamples: int = DEFAULT_RESAMPLES, level: float = 0.95, seed: int = 0,
              n: int | None = None) -> Estimate:
    """The statistic on the units, with a percentile-bootstrap interval from resampling the units with
    replacement (fewer resamples for a very large set, so an answer stays quick; never fewer than 200); no
    interval from fewer than MIN_INTERVAL_UNITS units or labels (`n`: the labels behind the statistic)."""
    value = statistic(units)
    count = len(units) if n is None else n
    if value is None or min(len(units), count) < MIN_INTERVAL_UNITS or resamples <= 0:
        return Estimate(value, None, None, count)
    resamples = min(resamples, max(200, MAX_BOOTSTRAP_WORK // len(units)))
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        drawn = statistic(rng.choices(units, k=len(units)))
        if drawn is not None:
            draws.append(drawn)
    if len(draws) < 20:
        return Estimate(value, None, None, count)
    draws.sort()
    tail = (1 - level) / 2
    return Estimate(value, draws[int(tail * (len(draws) - 1))], draws[int((1 - tail) * (len(draws) - 1))], count)


def agreement(judge: Sequence[bool], human: Sequence[bool], probabilities: Sequence[float] | None = None, *,
              resamples: int = DEFAULT_RESAMPLES, level: float = 0.95, seed: int = 0) -> Agreement:
    """Kappa and accuracy of the judge's verdicts against the humans', each item weighted by 1 / the probability
    its queue chose it (all 1 when not given), with percentile-bootstrap intervals at `level`."""
    if not len(judge) == len(human) == len(probabilities if probabilities is not None else judge):
        raise ValueError("judge, human and probabilities must have one entry per reviewed item")
    if probabilities is not None and any(not 0 < p <= 1 for p in probabilities):
        raise ValueError("a sampling probability must be in (0, 1]")
    weights = [1.0 / p for p in probabilities] if probabilities is not None else [1.0] * len(judge)
    pairs = list(zip(judge, human, weights, strict=True))
    kw = {"resamples": resamples, "level": level, "seed": seed}
    return Agreement(bootstrap(pairs, lambda s: _kappa_and_accuracy(s)[0], **kw),
                     bootstrap(pairs, lambda s: _kappa_and_accuracy(s)[1], **kw))


def _parts(items: Sequence[ReviewedItem], which: str) -> list[tuple[bool, bool, float]]:
    return [(j, h, item.weight) for item in items for j, h in getattr(item, which)]


def _mean_abs_diff(items: Sequence[ReviewedItem]) -> float | None:
    scored = [(abs(i.judge_score - i.human_score), i.weight) for i in items
              if i.judge_score is not None and i.human_score is not None]
    total = sum(w for _, w in scored)
    return sum(d * w for d, w in scored) / total if total > 0 else None


def _auc(items: Sequence[ReviewedItem]) -> float | None:
    scored = [i for i in items if i.judge_score is not None]
    return weighted_auc([i.judge_score for i in scored],  # type: ignore[misc]
                        [i.human_pass for i in scored], [i.weight for i in scored])


Pairs = Callable[[Sequence[ReviewedItem]], list[tuple[bool, bool, float]]]


def _verdicts(items: Sequence[ReviewedItem]) -> list[tuple[bool, bool, float]]:
    return [(i.judge_pass, i.human_pass, i.weight) for i in items]


def _between_reviewers(items: Sequence[ReviewedItem]) -> list[tuple[bool, bool, float]]:
    return [(i.human_pass, i.second_human_pass, i.weight) for i in items if i.second_human_pass is not None]


def _tasks(items: Sequence[ReviewedItem]) -> list[tuple[bool, bool, float]]:
    return _parts(items, "tasks")


def _calls(items: Sequence[ReviewedItem]) -> list[tuple[bool, bool, float]]:
    return _parts(items, "calls")


def full_agreement(items: Sequence[ReviewedItem], *, resamples: int = DEFAULT_RESAMPLES, level: float = 0.95,
                   seed: int = 0) -> FullAgreement:
    """Every figure of one group of reviews (see the module docstring for the estimators). The bootstrap resamples
    reviewed conversations (`cluster`), so two reviews of one conversation never count as independent evidence."""
    flat = list(items)
    groups: dict[Hashable, list[ReviewedItem]] = {}
    for position, item in enumerate(flat):
        groups.setdefault(item.cluster if item.cluster is not None else ("review", position), []).append(item)
    clusters = list(groups.values())
    # the work bound counts reviews, not conversations: each resample walks every review
    draws = min(resamples, max(200, MAX_BOOTSTRAP_WORK // max(len(flat), 1)))

    def figure(statistic: Callable[[list[ReviewedItem]], float | None], n: int) -> Estimate:
        return bootstrap(clusters, lambda drawn: statistic([i for cluster in drawn for i in cluster]), n=n,
                         resamples=draws, level=level, seed=seed)

    def agreement_of(pairs: Pairs, k: int) -> Estimate:  # k: 0 kappa, 1 accuracy
        return figure(lambda reviews: _kappa_and_accuracy(pairs(reviews))[k], len(pairs(flat)))

    return FullAgreement(
        kappa=agreement_of(_verdicts, 0),
        accuracy=agreement_of(_verdicts, 1),
        mean_abs_diff=figure(_mean_abs_diff, sum(1 for i in flat
                                                 if i.judge_score is not None and i.human_score is not None)),
        auc=figure(_auc, sum(1 for i in flat if i.judge_score is not None)),
        task_kappa=agreement_of(_tasks, 0),
        task_accuracy=agreement_of(_tasks, 1),
        call_kappa=agreement_of(_calls, 0),
        call_accuracy=agreement_of(_calls, 1),
        reviewer_kappa=agreement_of(_between_reviewers, 0),
    )
