"""Regex redaction of personal data and secrets before spans reach the database or a judge.

Each match becomes `[REDACTED:<rule>:<hash8>]`: the hash (sha256 of salt + match) keeps two different
e-mail addresses different, so a conversation keyed on a user id stays one conversation and distinct
from the others, without storing the value. Set a secret salt, or `hashed = false`, when the values are
guessable (an unsalted hash of a known address can be checked by anyone who has the database).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from tracejudge.mapping.spans import Span, SpanEvent, SpanLink


def _luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = int(ch)
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _card_number(match: re.Match[str]) -> bool:
    digits = re.sub(r"[ -]", "", match.group(0))
    return 13 <= len(digits) <= 19 and _luhn_valid(digits)


@dataclass(frozen=True)
class Rule:
    """One pattern; `accept` can veto a match (the card rule keeps only Luhn-valid numbers)."""

    name: str
    pattern: re.Pattern[str]
    accept: Callable[[re.Match[str]], bool] | None = None
    hint: re.Pattern[str] | None = None  # no hit: the text cannot match, skip the full rule (fast path)

    def may_match(self, text: str) -> bool:
        return self.hint is None or self.hint.search(text) is not None


# Every quantifier is bounded or possessive and every rule starts only where a run of its characters
# starts, so a 10 MB attribute of near-misses is scanned in linear time (no backtracking blow-up).
BUILTIN_RULES: dict[str, Rule] = {
    "email": Rule("email", re.compile(
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.){1,10}[A-Za-z]{2,24}(?![A-Za-z0-9-])"),
        hint=re.compile("@")),
    "api_key": Rule("api_key", re.compile(
        r"(?<![A-Za-z0-9_-])(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}+"  # OpenAI, Anthropic
        r"|AKIA[0-9A-Z]{16}(?![0-9A-Z])"  # AWS access key id
        r"|gh[pousr]_[A-Za-z0-9]{30,}+"  # GitHub
        r"|xox[abposr]-[A-Za-z0-9-]{10,}+"  # Slack
        r"|AIza[0-9A-Za-z_-]{35}"  # Google
        r"|eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+)"  # JWT
        r"|(?<=[Bb]earer )[A-Za-z0-9._~+/=-]{12,}+"
        r"|(?i:(?<=api_key=)|(?<=api-key=)|(?<=apikey=)|(?<=token=)|(?<=secret=)|(?<=password=))[^\s&\"']{8,}+"),
        hint=re.compile(r"sk-|AKIA|gh[pousr]_|xox|AIza|eyJ|earer |=")),
    "card_number": Rule("card_number", re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"), _card_number,
                        hint=re.compile(r"\d[ -]?\d[ -]?\d[ -]?\d")),
}


class RedactionRuleError(ValueError):
    """A rule in [redaction] is not a valid regular expression or names no builtin rule."""


@dataclass(frozen=True)
class Redactor:
    """Applies its rules, in order, to every string inside a value (nested lists and dicts included)."""

    rules: tuple[Rule, ...]
    salt: str = ""
    hashed: bool = True

    @classmethod
    def build(cls, builtin: Iterable[str], patterns: dict[str, str], salt: str = "", hashed: bool = True) -> Redactor:
        """From rule names and `{name: regex}`; RedactionRuleError says which one is wrong."""
        rules = []
        for name in builtin:
            if name not in BUILTIN_RULES:
                raise RedactionRuleError(f"unknown builtin rule {name!r}; known: {', '.join(BUILTIN_RULES)}")
            rules.append(BUILTIN_RULES[name])
        for name, pattern in patterns.items():
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise RedactionRuleError(f"rule {name!r}: {pattern!r} is not a valid regular expression: {exc}") \
                    from None
            if compiled.search(""):
                raise RedactionRuleError(f"rule {name!r}: {pattern!r} matches the empty string")
            rules.append(Rule(name, compiled))
        return cls(tuple(rules), salt, hashed)

    def text(self, value: str) -> str:
        for rule in self.rules:
            if rule.may_match(value):
                value = rule.pattern.sub(lambda m, r=rule: self._replacement(r, m), value)
        return value

    def _replacement(self, rule: Rule, match: re.Match[str]) -> str:
        if rule.accept is not None and not rule.accept(match):
            return match.group(0)
        if not self.hashed:
            return f"[REDACTED:{rule.name}]"
        digest = hashlib.sha256((self.salt + match.group(0)).encode("utf-8", "surrogatepass")).hexdigest()[:8]
        return f"[REDACTED:{rule.name}:{digest}]"

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value

    def attributes(self, attributes: dict[str, Any]) -> dict[str, Any]:
        return {k: self.value(v) for k, v in attributes.items()}

    def span(self, span: Span, resource: dict[str, Any] | None = None) -> Span:
        """The span with its name, attributes, events, links, resource and status text redacted."""
        return replace(
            span, name=self.text(span.name), attributes=self.attributes(span.attributes),
            status_message=self.text(span.status_message),
            events=[SpanEvent(self.text(e.name), e.time_ns, self.attributes(e.attributes)) for e in span.events],
            links=[SpanLink(lk.trace_id, lk.span_id, self.attributes(lk.attributes)) for lk in span.links],
            resource=self.attributes(span.resource) if resource is None else resource, _parsed={},
        )

    def spans(self, spans: list[Span]) -> list[Span]:
        """Redacted copies; spans that shared one resource still share one (redacted once)."""
        if not self.rules:
            return spans
        resources: dict[int, dict[str, Any]] = {}
        out = []
        for s in spans:
            resource = resources.get(id(s.resource))
            if resource is None:
                resource = resources[id(s.resource)] = self.attributes(s.resource)
            out.append(self.span(s, resource))
        return out
