"""A judge outage pauses its metric's jobs instead of using up their attempts.

When a judge stays unreachable through its own retries (429 storms, 5xx, refused connections), every
job of that metric waits together, with the wait doubling per consecutive failure up to a cap, and the
failed job's attempt is given back: an outage of minutes or hours costs no job, and the judge is not
hammered by each job in turn while it is down. The first success ends the outage.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass
class JudgeOutage:
    base_s: float
    max_s: float
    streak: int = 0
    until: datetime | None = None
    successes: int = 0

    def failed(self, now: datetime) -> datetime:
        """Record one more unavailable answer; when the metric's jobs may try again. Jobs that were already
        in flight when the pause began fail together: they count once, not once each."""
        if self.blocks(now):
            assert self.until is not None
            return self.until
        self.streak += 1
        delay = min(self.base_s * 2 ** (self.streak - 1), self.max_s)
        until = now + timedelta(seconds=delay)
        self.until = until if self.until is None or until > self.until else self.until
        return self.until

    def succeeded(self) -> None:
        self.streak, self.until = 0, None
        self.successes += 1

    def blocks(self, now: datetime) -> bool:
        return self.until is not None and now < self.until
