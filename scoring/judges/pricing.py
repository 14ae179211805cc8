"""Token prices of well-known judge models, in USD per million tokens, and the cost of a call.

Prices are the providers' list prices for standard (non-batch) text tokens as of 2026-12, with the
discounted rate of input tokens read from the provider's prompt cache. A model missing here costs None
(tokens are still counted); pass prices to `LLMJudge` to fix that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# model: (input, cached input, output) USD per 1M tokens
_PER_MILLION: dict[str, tuple[float, float, float]] = {
    "gpt-5.4": (2.50, 0.25, 15.00),
    "gpt-5.2": (1.75, 0.175, 14.00),
    "gpt-5.1": (1.25, 0.125, 10.00),
    "gpt-5": (1.25, 0.125, 10.00),
    "gpt-5-mini": (0.25, 0.025, 2.00),
    "gpt-5-nano": (0.05, 0.005, 0.40),
    "gpt-4.1": (2.00, 0.50, 8.00),
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1-nano": (0.10, 0.025, 0.40),
    "gpt-4o": (2.50, 1.25, 10.00),
    "gpt-4o-mini": (0.15, 0.075, 0.60),
    "o3": (2.00, 0.50, 8.00),
    "o3-mini": (1.10, 0.55, 4.40),
    "o4-mini": (1.10, 0.275, 4.40),
}

_DATED = re.compile(r"^(?P<base>.+?)-(\d{4}-\d{2}-\d{2}|\d{4})$")


@dataclass(frozen=True)
class TokenPrice:
    """USD per token for input, output and cached input (the input rate where no discount is known)."""

    input: float
    output: float
    cached_input: float | None = None

    def cost(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
        """`cached_tokens` are part of `input_tokens`, as OpenAI's usage reports them."""
        cached = min(cached_tokens, input_tokens)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return (input_tokens - cached) * self.input + cached * cached_rate + output_tokens * self.output


def known_price(model: str) -> TokenPrice | None:
    """The list price of `model` or of its dated snapshot (`gpt-4o-2024-08-06`), else None."""
    name = model.strip().lower().removeprefix("openai/")
    prices = _PER_MILLION.get(name)
    if prices is None and (match := _DATED.match(name)):
        prices = _PER_MILLION.get(match.group("base"))
    if prices is None:
        return None
    return TokenPrice(prices[0] / 1e6, prices[2] / 1e6, prices[1] / 1e6)
