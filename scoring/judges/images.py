"""Images in a judge prompt: where a test case's text holds an `MLLMImage` placeholder, the request carries the
image itself as a content part (a data URI for a local file or Base64 data, the URL for a remote one), as
OpenAI-compatible vision models take it. A placeholder whose image this process does not hold stays text."""

from __future__ import annotations

import re
from typing import Any

from tracejudge.test_case.llm_test_case import image_of

_PLACEHOLDER = re.compile(r"\[DEEPEVAL:IMAGE:(?P<id>[0-9a-f]+)\]")


def with_images(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages, each whose text holds image placeholders split into text and image parts."""
    return [_message(m) for m in messages]


def _message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, str) or "[DEEPEVAL:IMAGE:" not in content:
        return message
    parts: list[dict[str, Any]] = []
    last = 0
    for found in _PLACEHOLDER.finditer(content):
        image = image_of(found["id"])
        if image is None:
            continue
        url = image.url if image.dataBase64 is None else f"data:{image.mimeType};base64,{image.dataBase64}"
        parts += [{"type": "text", "text": content[last:found.start()]},
                  {"type": "image_url", "image_url": {"url": url}}]
        last = found.end()
    if not parts:
        return message
    parts.append({"type": "text", "text": content[last:]})
    return {**message, "content": [p for p in parts if p["type"] != "text" or p["text"]]}
