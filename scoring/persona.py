"""Who a simulated user is (`Persona`), beside what they want (the golden's scenario), as DeepEval's goldens carry
it. The simulator puts `prompt_block()` in the simulated user's prompt; the voice fields (interruptions, speaking
first, the voice, background noise, hold timeout) are kept and validated for datasets shared with voice tools,
and ignored by tracejudge's text simulation.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

InterruptionLevel = Literal["rare", "normal", "frequent"]
OverlapBehavior = Literal["yield", "adaptive", "insist"]
_LEVELS: tuple[InterruptionLevel, ...] = ("rare", "normal", "frequent")
_OVERLAPS: tuple[OverlapBehavior, ...] = ("yield", "adaptive", "insist")
_HOW_OFTEN = {
    "rare": "Now and then you interrupt the agent before it has finished.",
    "normal": "You interrupt the agent before it has finished from time to time.",
    "frequent": "You interrupt the agent a lot, often before it has finished a sentence.",
}
_WHEN_BOTH_TALK = {
    "yield": "When you and the agent talk over each other, you stop and let it finish.",
    "adaptive": "When you and the agent talk over each other, you go on for a moment, then stop.",
    "insist": "When you and the agent talk over each other, you go on talking until it stops.",
}


@dataclass
class InterruptionBehavior:
    """How readily a simulated caller talks over the agent (voice simulations)."""

    frequency: InterruptionLevel = "normal"
    overlap: OverlapBehavior = "adaptive"

    def __post_init__(self) -> None:
        if self.frequency not in _LEVELS:
            raise ValueError(f"unknown interruption frequency {self.frequency!r}: use one of {', '.join(_LEVELS)}")
        if self.overlap not in _OVERLAPS:
            raise ValueError(f"unknown overlap behavior {self.overlap!r}: use one of {', '.join(_OVERLAPS)}")


class BackgroundNoiseSettings(BaseModel):
    """Audio (a .wav or .mp3 path) played under a simulated caller's speech, at a volume from 0 to 1."""

    audio: str
    volume: float = Field(default=0.3, ge=0.0, le=1.0)


class Persona(BaseModel):
    """Who the simulated user is: a name and free-form characteristics (personality, style, mood), never the task,
    which is the golden's scenario. The fields after `characteristics` are for voice simulations only."""

    name: str | None = None
    characteristics: str
    interruption_behavior: InterruptionBehavior | None = None
    speaks_first: bool = True
    muted: bool = False
    voice: str | None = None
    background_noise: BackgroundNoiseSettings | None = None
    multilingual_stt: bool = False
    hold_timeout: float | None = Field(default=None, gt=0)  # seconds of silence before the caller hangs up

    def prompt_block(self) -> str:
        """The persona as the simulated user's prompt takes it: tagged, since the characteristics are free text
        that may hold quotes or tags of their own."""
        sections = [f"Name: {self.name}"] if self.name else []
        sections.append(self.characteristics.strip())
        behaviour = []
        if self.interruption_behavior is not None:
            behaviour += [_HOW_OFTEN[self.interruption_behavior.frequency],
                          _WHEN_BOTH_TALK[self.interruption_behavior.overlap]]
        if not self.speaks_first:
            behaviour.append("You never start the conversation: the agent speaks before you do.")
        if behaviour:
            sections.append("\n".join(behaviour))
        body = "\n\n".join(s for s in sections if s)
        return f"<persona>\n{body}\n</persona>"

    def tts_kwargs(self) -> dict[str, str]:
        """What a text-to-speech model takes of this persona: its voice, if it has one."""
        return {} if self.voice is None else {"voice": self.voice}


def resolve_persona(persona: Persona | None, user_description: str | None) -> tuple[Persona | None, str | None]:
    """The persona and the older `user_description`, kept in step: either gives the other. Passing the old field
    alone warns; passing both with different text is refused."""
    if persona is None:
        if user_description is None:
            return None, None
        warnings.warn("'user_description' is deprecated: pass persona=Persona(characteristics=...) instead",
                      DeprecationWarning, stacklevel=4)
        return Persona(characteristics=user_description), user_description
    if user_description is not None and user_description != persona.characteristics:
        raise ValueError("the persona's characteristics and user_description are conflicting texts: pass the "
                         "persona alone")
    return persona, persona.characteristics
