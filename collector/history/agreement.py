"""How often the judge agrees with people: Cohen's kappa and accuracy between the judge's pass/fail and a human's,
on reviewed items that a queue chose with known probabilities.

Estimator: each item weighs the inverse of the probability its queue rule had of choosing it (Horvitz-Thompson
weights), so the proportions behind kappa (observed agreement, each side's pass rate) estimate all traffic, not
the queue's mix (a queue of failures alone would overstate how often the judge fails). Interval: the percentile
bootstrap over reviewed items, resampled with their weights (`bench/agreement.py` checks its coverage and the
estimator's bias by simulation). Pure: numbers in, numbers out.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_RESAMPLES = 1000


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


def _kappa_and_accuracy(pairs: Sequence[tuple[bool, bool, float]]) -> tuple[float | None, float | None]:
    total = sum(w for _, _, w in pairs)
    if total <= 0:
        return None, None
    observed = sum(w for judge, human, w in pairs if judge == human) / total
    judge_pass = sum(w for judge, _, w in pairs if judge) / total
    human_pass = sum(w for _, human, w in pairs if human) / total
    chance = judge_pass * human_pass + (1 - judge_pass) * (1 - human_pass)
    kappa = None if chance >= 1 else (observed - chance) / (1 - chance)
    return kappa, observed


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
    kappa, accuracy = _kappa_and_accuracy(pairs)
    n = len(pairs)
    if n == 0:
        empty = Estimate(None, None, None, 0)
        return Agreement(empty, empty)
    rng = random.Random(seed)
    kappas: list[float] = []
    accuracies: list[float] = []
    for _ in range(resamples):
        k, a = _kappa_and_accuracy([pairs[rng.randrange(n)] for _ in range(n)])
        if k is not None:
            kappas.append(k)
        if a is not None:
            accuracies.append(a)
    return Agreement(_estimate(kappa, kappas, level, n), _estimate(accuracy, accuracies, level, n))


def _estimate(value: float | None, draws: list[float], level: float, n: int) -> Estimate:
    if value is None or len(draws) < 20:
        return Estimate(value, None, None, n)
    draws.sort()
    tail = (1 - level) / 2
    low = draws[int(tail * (len(draws) - 1))]
    high = draws[int((1 - tail) * (len(draws) - 1))]
    return Estimate(value, low, high, n)
