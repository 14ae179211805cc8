"""Token counts for judge prompts: OpenAI's own BPE tables where the model is known, an estimate otherwise.

The tables ship inside the `bpe-openai` wheel, so counting works offline (air-gapped deployments); nothing is
downloaded at run time. For other models (Llama, Qwen, Mistral behind vLLM or llama.cpp) the o200k count is
scaled up by a margin, and a server's "context length exceeded" answer still corrects the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import bpe_openai

CHUNK_CHARS = 200_000  # bpe-openai refuses to encode more than 200k tokens at once: count in slices
UNKNOWN_MODEL_MARGIN = 1.25  # other tokenizers spend up to about a quarter more tokens on JSON than o200k


class TokenCounter(Protocol):
    """Counts the tokens a text costs one model; `exact` is False for estimates."""

    name: str
    exact: bool

    def count(self, text: str) -> int: ...

    def upper_bound(self, text: str) -> int:
        """A cheap bound that `count` never exceeds, to skip counting prompts far inside the budget."""
        ...


@dataclass(frozen=True)
class BpeCounter:
    """An OpenAI BPE encoding (o200k_base, cl100k_base), scaled by `margin` when used for another model."""

    encoding: str
    margin: float = 1.0

    @property
    def name(self) -> str:
        return self.encoding if self.margin == 1.0 else f"{self.encoding} x{self.margin:g} (estimate)"

    @property
    def exact(self) -> bool:
        return self.margin == 1.0

    def count(self, text: str) -> int:
        encoding = _encoding(self.encoding)
        tokens = sum(len(encoding.encode_ordinary(text[i:i + CHUNK_CHARS])) for i in range(0, len(text), CHUNK_CHARS))
        return tokens if self.margin == 1.0 else math.ceil(tokens * self.margin)

    def upper_bound(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8", "surrogatepass")) * self.margin)  # a BPE token is >= 1 byte


@dataclass(frozen=True)
class CharCounter:
    """One token per `chars_per_token` characters: the estimate System One's budget is defined in."""

    chars_per_token: float = 3.0
    name: str = "characters / 3"
    exact: bool = False

    def count(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)

    def upper_bound(self, text: str) -> int:
        return self.count(text)


@lru_cache(maxsize=4)
def _encoding(name: str) -> bpe_openai.Encoding:
    # imported on the first exact count: importing it adds about 66 MB of RSS (and o200k's table about 130 MB
    # more), which a collector whose prompts all fit under the cheap byte bound never needs
    import bpe_openai

    return bpe_openai.get_encoding(name)


_O200K_PREFIXES = ("gpt-5", "gpt-4.1", "gpt-4o", "o1", "o3", "o4", "chatgpt-4o", "gpt-oss")
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "gpt-35")


def counter_for_model(model: str) -> TokenCounter:
    """The exact encoding of an OpenAI model, else an o200k estimate with a safety margin."""
    name = model.strip().lower().removeprefix("openai/")
    if name.startswith(_O200K_PREFIXES):
        return BpeCounter("o200k_base")
    if name.startswith(_CL100K_PREFIXES):
        return BpeCounter("cl100k_base")
    return BpeCounter("o200k_base", UNKNOWN_MODEL_MARGIN)
