"""Context windows of well-known judge models, and how much of one a judge prompt may fill.

A model missing here gets DEFAULT_CONTEXT_TOKENS, small enough for a local server's usual setting; set
`LLMJudge(context_tokens=...)` (or `[scoring] judge_context_tokens`) for yours. A server that answers
"maximum context length is N tokens" also corrects the window for that judge.
"""

from __future__ import annotations

import re

DEFAULT_CONTEXT_TOKENS = 32_768
ANSWER_RESERVE_TOKENS = 2_048  # room left for the judge's answer (a reason and a score), reasoning excluded
MAX_PROMPT_TOKENS = 200_000  # past this a prompt costs more than it helps, even where the window allows it

_WINDOWS: tuple[tuple[str, int], ...] = (  # longest prefix first
    ("gpt-5", 400_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("gpt-oss", 131_072),
)

_LIMIT = re.compile(r"(?:maximum context length|context length|context window|context size|n_ctx|must be <=)"
                    r"[^0-9]{0,40}?(\d[\d,]{2,})", re.IGNORECASE)
_OVERFLOW = re.compile(r"context length|context window|context size|exceed_context_size|too many tokens|"
                       r"maximum context|exceeds? (?:the )?(?:model'?s? )?(?:context|max)|n_ctx|prompt is too long|"
                       r"reduce the length|tokens \+ `?max_new_tokens`? must be <=", re.IGNORECASE)


# models that read text only (every other OpenAI chat model since gpt-4o reads images too): a multimodal test case
# is refused for them, as DeepEval refuses it, instead of judging a placeholder for the image
TEXT_ONLY_MODELS = re.compile(r"^(?:openai/)?(?:gpt-3\.5|gpt-4(?:-\d{4}|-32k)?$|gpt-4-(?:0314|0613|32k)|"
                              r"text-davinci|davinci|babbage)")


def reads_text_only(model: str) -> bool:
    return bool(TEXT_ONLY_MODELS.match(model.strip().lower()))


def known_context_tokens(model: str) -> int | None:
    name = model.strip().lower().removeprefix("openai/")
    for prefix, window in _WINDOWS:
        if name.startswith(prefix):
            return window
    return None


def prompt_budget(context_tokens: int) -> int:
    """Tokens a prompt may take in a window of `context_tokens`, leaving room for the answer."""
    return max(512, min(MAX_PROMPT_TOKENS, context_tokens - ANSWER_RESERVE_TOKENS))


def overflow_limit(message: str) -> int | None | bool:
    """For a server's error text: the window it names (int), True when it says only that the prompt was too
    long, False when the error is about something else."""
    if not _OVERFLOW.search(message):
        return False
    match = _LIMIT.search(message)
    return int(match.group(1).replace(",", "")) if match else True
