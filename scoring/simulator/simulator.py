"""DeepEval's ConversationSimulator, same API: goldens driven through your agent by a scripted or simulated user.

- A golden whose `turns` hold user turns only is *scripted*: those turns are replayed in order, whatever the agent
  replies (deterministic, no simulator model). `scripted_users=True` replays the user turns of any golden (a
  production transcript from `EvaluationDataset.from_history`: its recorded assistant turns are dropped and
  produced again by the agent under test); `False` keeps DeepEval's meaning (the turns are the conversation so far).
- Otherwise a model plays the user from the golden's scenario and user description (temperature 0), until the
  controller ends it (default: the model says the expected outcome is reached) or `max_user_simulations` user
  turns were simulated. Its calls are costed apart from any judge's (`simulation_cost`, and per test case in
  `metadata["simulation"]`).
- Each conversation gets its own thread id, passed to the callback and, when OpenTelemetry is installed, set as the
  baggage `gen_ai.conversation.id` and `tracejudge.simulation.thread_id` around every callback call, so an
  instrumented agent's spans carry it (`tracejudge.collector.simulation` builds the test cases from those spans;
  the second key survives a framework that puts its own conversation id in the baggage, as pydantic-ai does).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tracejudge.dataset import ConversationalGolden
from tracejudge.judges.llm import LLMJudge
from tracejudge.judges.resolve import resolve_llm_judge
from tracejudge.loop_bridge import run_sync
from tracejudge.prompts import OutputSpec, system_prompt
from tracejudge.simulator.controller import CONTROLLER_ARGUMENTS, Decision, call_by_name
from tracejudge.simulator.template import ConversationSimulatorTemplate
from tracejudge.test_case import ConversationalTestCase, Turn

CONVERSATION_ID = "gen_ai.conversation.id"  # the baggage key (and span attribute) a simulated conversation carries
THREAD_ID = "tracejudge.simulation.thread_id"  # the same, under a key no framework sets: it survives their own ids


class SimulatedInput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    simulated_input: str = Field(strict=True, min_length=1)


class ConversationCompletion(BaseModel):
    model_config = ConfigDict(extra="ignore")
    is_complete: bool = Field(strict=True)
    reason: str = ""


_USER_SPEC = OutputSpec("simulated_input", {"type": "object", "properties": {"simulated_input": {"type": "string"}},
                                            "required": ["simulated_input"], "additionalProperties": False})
_DONE_SPEC = OutputSpec("conversation_completion", {
    "type": "object", "properties": {"is_complete": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["is_complete", "reason"], "additionalProperties": False})


class SimulationError(RuntimeError):
    """A conversation could not be simulated (the agent's callback or the simulator model failed)."""


class ConversationSimulator:
    def __init__(self, model_callback: Callable[..., Any], simulator_model: str | LLMJudge | None = None,
                 opening_message: str | None = None, max_concurrent: int = 5, async_mode: bool = True,
                 language: str = "English", controller: Callable[..., Any] | None = None,
                 simulation_template: type[ConversationSimulatorTemplate] = ConversationSimulatorTemplate,
                 scripted_users: bool | None = None, show_progress: bool | None = None) -> None:
        """`model_callback(input, turns=..., thread_id=...)`, sync or async, returns the assistant's Turn (or its
        text); it may take any of those arguments by name. `simulator_model` plays the user (an OpenAI-compatible
        model name or an LLMJudge; built only when a golden needs it)."""
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self.model_callback = model_callback
        self._simulator_model = simulator_model
        self._simulator: LLMJudge | None = None
        self.opening_message = opening_message
        self.max_concurrent = max_concurrent
        self.async_mode = async_mode
        self.language = language
        self.controller = controller
        self.template = simulation_template
        self.scripted_users = scripted_users
        self.show_progress = sys.stderr.isatty() if show_progress is None else show_progress
        self.simulated_conversations: list[ConversationalTestCase] = []
        self.simulation_cost: float | None = 0.0

    @property
    def simulator(self) -> LLMJudge:
        if self._simulator is None:
            self._simulator = resolve_llm_judge(self._simulator_model)
        return self._simulator

    def simulate(self, conversational_goldens: Sequence[ConversationalGolden], max_user_simulations: int = 10,
                 on_simulation_complete: Callable[[ConversationalTestCase, int], Any] | None = None,
                 ) -> list[ConversationalTestCase]:
        """One ConversationalTestCase per golden, in the goldens' order, with its scenario, expected outcome and
        user description; `on_simulation_complete(test_case, index)` as each finishes."""
        if max_user_simulations <= 0:
            raise ValueError("max_user_simulations must be greater than 0")
        return run_sync(self.a_simulate(conversational_goldens, max_user_simulations, on_simulation_complete))

    async def a_simulate(self, conversational_goldens: Sequence[ConversationalGolden], max_user_simulations: int = 10,
                         on_simulation_complete: Callable[[ConversationalTestCase, int], Any] | None = None,
                         ) -> list[ConversationalTestCase]:
        goldens = [g if isinstance(g, ConversationalGolden) else ConversationalGolden.model_validate(g)
                   for g in conversational_goldens]
        self.simulation_cost = 0.0
        semaphore = asyncio.Semaphore(self.max_concurrent if self.async_mode else 1)
        done = 0

        async def one(index: int, golden: ConversationalGolden) -> ConversationalTestCase:
            nonlocal done
            async with semaphore:
                case = await self._conversation(golden, index, max_user_simulations)
            done += 1
            if self.show_progress:
                print(f"\rsimulated {done}/{len(goldens)} conversations", end="", file=sys.stderr, flush=True)
            if on_simulation_complete is not None:
                result = on_simulation_complete(case, index)
                if inspect.isawaitable(result):
                    await result
            return case

        async with self._session():
            cases = await asyncio.gather(*(one(i, g) for i, g in enumerate(goldens)))
        if self.show_progress and goldens:
            print(file=sys.stderr)
        self.simulated_conversations = list(cases)
        return self.simulated_conversations

    @contextlib.asynccontextmanager
    async def _session(self) -> Any:
        """One connection pool for the simulator model, when one was given or built."""
        if self._simulator is None and self._simulator_model is None:
            yield
            return
        async with self.simulator.session():
            yield

    def _scripted(self, golden: ConversationalGolden) -> list[str] | None:
        """The user turns to replay, or None when the user is simulated."""
        if not golden.turns:
            return None
        users = [t.content for t in golden.turns if t.role == "user"]
        if self.scripted_users or (self.scripted_users is None and len(users) == len(golden.turns)):
            return users
        return None

    async def _conversation(self, golden: ConversationalGolden, index: int,
                            max_user_simulations: int) -> ConversationalTestCase:
        thread_id = str(uuid.uuid4())
        cost: dict[str, Any] = {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
        scripted = self._scripted(golden)
        turns: list[Turn] = []
        stopped: str
        if scripted is not None:
            for text in scripted:
                turns.append(Turn(role="user", content=text))
                turns.append(await self._reply(text, turns, thread_id))
            stopped = "scripted: every user turn replayed"
        else:
            if golden.turns:
                turns.extend(golden.turns)
            elif self.opening_message:
                turns.append(Turn(role="assistant", content=self.opening_message))
            simulated = 0
            while True:
                if simulated >= max_user_simulations:
                    stopped = f"max_user_simulations ({max_user_simulations}) reached"
                    break
                if turns and turns[-1].role == "user":  # a golden whose turns end with the user's
                    text = turns[-1].content
                else:
                    first = not any(t.role == "user" for t in turns)
                    prompt = (self.template.simulate_first_user_turn(golden, self.language) if first
                              else self.template.simulate_user_turn(golden, turns, self.language))
                    text = (await self._ask("simulated_user", prompt, SimulatedInput, _USER_SPEC, cost)
                            ).simulated_input
                    turns.append(Turn(role="user", content=text))
                    simulated += 1
                turns.append(await self._reply(text, turns, thread_id))
                decision = await self._decide(turns, golden, index, thread_id, simulated, max_user_simulations,
                                              cost)
                if decision.should_end:
                    stopped = decision.reason or "the controller ended it"
                    break
        if self.simulation_cost is not None:
            self.simulation_cost = (self.simulation_cost + cost["cost_usd"]) if cost["cost_usd"] is not None \
                else None
        metadata = {**(golden.metadata or {}), "User Description": golden.user_description,
                    "simulation": {"thread_id": thread_id, "stopped": stopped,
                                   "user": "scripted" if scripted is not None else "simulated", **cost}}
        return ConversationalTestCase(turns=turns, scenario=golden.scenario, expected_outcome=golden.expected_outcome,
                                      user_description=golden.user_description, context=golden.context,
                                      name=golden.name, comments=golden.comments, metadata=metadata)

    async def _reply(self, text: str, turns: list[Turn], thread_id: str) -> Turn:
        """The agent's turn: the callback, under the conversation's id in OpenTelemetry baggage."""
        arguments = {"input": text, "turns": list(turns), "thread_id": thread_id}
        try:
            with _conversation_baggage(thread_id):
                if inspect.iscoroutinefunction(self.model_callback):
                    reply = await call_by_name(self.model_callback, arguments)
                else:  # a blocking agent runs in a thread (with this context) while other conversations go on
                    reply = await asyncio.to_thread(call_by_name, self.model_callback, arguments)
                    if inspect.isawaitable(reply):
                        reply = await reply
        except Exception as exc:
            raise SimulationError(f"the model_callback failed on {text[:80]!r}: {type(exc).__name__}: {exc}") from exc
        if isinstance(reply, str):
            return Turn(role="assistant", content=reply)
        if not isinstance(reply, Turn):
            raise SimulationError(f"the model_callback must return a Turn or its text, not {type(reply).__name__}")
        return reply

    async def _decide(self, turns: list[Turn], golden: ConversationalGolden, index: int, thread_id: str,
                      simulated: int, max_user_simulations: int, cost: dict[str, Any]) -> Decision:
        if self.controller is not None:
            context = dict(zip(CONTROLLER_ARGUMENTS, (
                list(turns), golden, index, thread_id, simulated, max_user_simulations,
                next((t for t in reversed(turns) if t.role == "user"), None),
                next((t for t in reversed(turns) if t.role == "assistant"), None)), strict=True))
            decision = call_by_name(self.controller, context)
            if inspect.isawaitable(decision):
                decision = await decision
            return decision if isinstance(decision, Decision) else Decision(False)
        if not golden.expected_outcome:
            return Decision(False)
        verdict = await self._ask("conversation_complete", self.template.check_expected_outcome(
            turns, golden.expected_outcome), ConversationCompletion, _DONE_SPEC, cost)
        return Decision(verdict.is_complete, f"expected outcome reached: {verdict.reason}" if verdict.is_complete
                        else None)

    async def _ask(self, name: str, prompt: str, output: type[Any], spec: OutputSpec, cost: dict[str, Any]) -> Any:
        """One answer of the simulator model, its tokens and money added to the conversation's cost."""
        messages = [{"role": "system", "content": system_prompt(name, "You simulate a user to test an AI agent.",
                                                                   spec)},
                    {"role": "user", "content": prompt}]
        judgement = await self.simulator.judge(messages, output, spec)
        cost["calls"] += 1
        cost["input_tokens"] += judgement.input_tokens
        cost["output_tokens"] += judgement.output_tokens
        cost["cost_usd"] = None if judgement.cost is None or cost["cost_usd"] is None \
            else cost["cost_usd"] + judgement.cost
        return judgement.value


@contextlib.contextmanager
def _conversation_baggage(thread_id: str) -> Iterator[None]:
    """The conversation id in OpenTelemetry baggage while the agent runs (nothing when OTel is not installed)."""
    try:
        from opentelemetry import baggage, context
    except ImportError:
        yield
        return
    token = context.attach(baggage.set_baggage(THREAD_ID, thread_id,
                                               baggage.set_baggage(CONVERSATION_ID, thread_id)))
    try:
        yield
    finally:
        context.detach(token)
