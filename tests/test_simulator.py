"""DeepEval's conversation simulator at tracejudge.simulator (issue 40): DeepEval's documented example with only the
import changed; a scripted user replays its turns exactly; a simulated user (a scripted OpenAI-compatible server
on loopback plays it) stops when the expected outcome is reached, at the turn limit, or when a controller ends it;
and an OpenTelemetry-instrumented agent's simulated conversations are rebuilt from its own spans, MCP calls and
inventory included, while its callback returns only the reply text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from tests.support.scripted_server import Reply, Request, completion


def user_and_judge(request: Request) -> Reply:
    """Plays the user (asks for a ticket, then confirms) and says the outcome is reached once a ticket is booked."""
    if request.judge == "conversation_complete":
        return completion({"is_complete": "Ticket #42 booked" in request.user, "reason": "the ticket is booked"})
    if "Write the user's first message" in request.user:
        return completion({"simulated_input": "I want a VIP ticket for the Coldplay concert."})
    return completion({"simulated_input": "Yes, book it please."})


def test_deepevals_documented_example_runs_with_only_the_import_changed(judge_server) -> None:
    judge_server.script = user_and_judge
    from tracejudge.dataset import ConversationalGolden
    from tracejudge.simulator import ConversationSimulator
    from tracejudge.test_case import Turn

    with pytest.warns(DeprecationWarning, match="user_description"):  # as DeepEval now warns: a Persona replaces it
        conversation_golden = ConversationalGolden(
            scenario="Andy Byron wants to purchase a VIP ticket to a cold play concert.",
            expected_outcome="Successful purchase of a ticket.",
            user_description="Andy Byron is the CEO of Astronomer.",
        )

    async def chatbot_callback(input):  # noqa: A002 - DeepEval's argument name
        return Turn(role="assistant", content=f"Chatbot response to: {input}")

    simulator = ConversationSimulator(model_callback=chatbot_callback)
    conversational_test_cases = simulator.simulate(conversational_goldens=[conversation_golden])
    [case] = conversational_test_cases
    assert case.scenario == conversation_golden.scenario and case.expected_outcome == "Successful purchase of a ticket."
    assert case.user_description == "Andy Byron is the CEO of Astronomer."
    # never booked: the simulated user goes on to the limit (DeepEval's default, 10 user turns)
    assert [t.role for t in case.turns] == ["user", "assistant"] * 10
    assert case.turns[1].content == "Chatbot response to: I want a VIP ticket for the Coldplay concert."
    assert case.metadata["simulation"]["stopped"] == "max_user_simulations (10) reached"
    simulated = case.metadata["simulation"]
    assert simulated["calls"] == 10 + 10 and simulated["input_tokens"] > 0  # 10 user turns, 10 outcome checks


def test_the_simulated_user_is_prompted_with_the_goldens_persona(judge_server) -> None:
    from tracejudge.dataset import ConversationalGolden, InterruptionBehavior, Persona
    from tracejudge.simulator import ConversationSimulator

    prompts: list[str] = []

    def user(request: Request) -> Reply:
        if request.judge != "conversation_complete":
            prompts.append(request.user)
        return user_and_judge(request)

    judge_server.script = user
    persona = Persona(name="Dana", characteristics="Impatient; writes in short bursts.", speaks_first=False,
                      interruption_behavior=InterruptionBehavior(frequency="frequent", overlap="insist"))
    golden = ConversationalGolden(scenario="Buy a VIP ticket", expected_outcome="A ticket is booked", persona=persona)
    assert golden.user_description == "Impatient; writes in short bursts."  # the older field follows the persona
    [case] = ConversationSimulator(model_callback=lambda input: "Ticket #42 booked for you.").simulate(
        [golden], max_user_simulations=2)
    assert case.user_description == "Impatient; writes in short bursts."
    assert prompts and all("Who the user is: \n<persona>\nName: Dana\n\nImpatient; writes in short bursts.\n\n"
                           in prompt for prompt in prompts)


def test_a_simulated_user_stops_when_the_expected_outcome_is_reached(judge_server) -> None:
    judge_server.script = user_and_judge
    from tracejudge.dataset import ConversationalGolden
    from tracejudge.simulator import ConversationSimulator

    seen: list[dict[str, Any]] = []

    def booking_agent(input: str, turns: list, thread_id: str) -> str:  # noqa: A002
        seen.append({"input": input, "turns": len(turns), "thread_id": thread_id})
        return "Ticket #42 booked for you." if input.startswith("Yes") else "A VIP ticket is 300 EUR. Shall I book?"

    completed: list[int] = []
    golden = ConversationalGolden(scenario="Buy a VIP ticket", expected_outcome="A ticket is booked")
    cases = ConversationSimulator(model_callback=booking_agent, max_concurrent=2).simulate(
        [golden, golden], max_user_simulations=5, on_simulation_complete=lambda case, index: completed.append(index))
    assert sorted(completed) == [0, 1]
    for case in cases:
        assert [t.content for t in case.turns] == [
            "I want a VIP ticket for the Coldplay concert.", "A VIP ticket is 300 EUR. Shall I book?",
            "Yes, book it please.", "Ticket #42 booked for you."]
        assert case.metadata["simulation"]["stopped"].startswith("expected outcome reached")
    assert len({s["thread_id"] for s in seen}) == 2 and [s["turns"] for s in seen[:1]] == [1]


def test_a_scripted_user_replays_its_turns_whatever_the_agent_says_and_needs_no_model() -> None:
    from tracejudge.dataset import ConversationalGolden
    from tracejudge.simulator import ConversationSimulator, end
    from tracejudge.test_case import Turn

    replies = iter(["Sorry?", "Still no idea.", "Fine."])
    golden = ConversationalGolden(scenario="weather", turns=[Turn(role="user", content=q) for q in
                                                             ("Weather in Paris?", "And Rome?", "Thanks")])
    [case] = ConversationSimulator(model_callback=lambda input: next(replies)).simulate([golden])  # noqa: A002
    assert [(t.role, t.content) for t in case.turns] == [
        ("user", "Weather in Paris?"), ("assistant", "Sorry?"), ("user", "And Rome?"),
        ("assistant", "Still no idea."), ("user", "Thanks"), ("assistant", "Fine.")]
    assert case.metadata["simulation"]["user"] == "scripted" and case.metadata["simulation"]["calls"] == 0

    # a production transcript replayed: its recorded assistant turns are produced again by the agent under test
    history = ConversationalGolden(scenario="weather", turns=[
        Turn(role="user", content="Weather in Oslo?"), Turn(role="assistant", content="old answer")])
    [again] = ConversationSimulator(model_callback=lambda input: "new answer", scripted_users=True).simulate(
        [history])
    assert [t.content for t in again.turns] == ["Weather in Oslo?", "new answer"]

    # a controller ends a conversation, DeepEval's way (arguments by name)
    golden = ConversationalGolden(scenario="x", turns=[Turn(role="user", content="hi"),
                                                      Turn(role="assistant", content="hello"),
                                                      Turn(role="user", content="book it")])

    def controller(last_assistant_turn: Any, simulated_user_turns: int) -> Any:
        return end("booked") if "booked" in last_assistant_turn.content else None

    [ended] = ConversationSimulator(model_callback=lambda input: "booked", controller=controller,
                                    scripted_users=False).simulate([golden])
    assert ended.turns[-1].content == "booked" and ended.metadata["simulation"]["stopped"] == "booked"

    with pytest.raises(ValueError, match="greater than 0"):
        ConversationSimulator(model_callback=lambda input: "x").simulate([golden], max_user_simulations=0)


def test_an_instrumented_agents_conversations_come_from_its_own_spans(judge_server) -> None:
    """The agent records OTel GenAI + MCP spans as instrumented agents do; its callback returns only text. The
    test cases built from the spans carry the MCP calls, with each conversation's own spans only."""
    from tracejudge.collector.simulation import TracedConversations
    from tracejudge.dataset import ConversationalGolden
    from tracejudge.simulator import ConversationSimulator
    from tracejudge.test_case import Turn

    provider = TracerProvider()
    tracer = provider.get_tracer("weather-agent")

    def agent(input: str) -> str:  # noqa: A002 - knows nothing of conversation ids: the baggage carries them
        city = input.split()[-1].rstrip("?")
        reply = f"It is sunny in {city}."
        messages = {"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text",
                                                                                     "content": input}]}]),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text",
                                                                                           "content": reply}]}])}
        with (tracer.start_as_current_span("invoke_agent weather", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather", **messages}),
              tracer.start_as_current_span("execute_tool get_forecast", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_forecast",
                "mcp.method.name": "tools/call", "gen_ai.tool.call.arguments": json.dumps({"city": city}),
                "gen_ai.tool.call.result": json.dumps({"content": [{"type": "text", "text": "Sunny"}]})})):
            pass
        return reply

    goldens = [ConversationalGolden(scenario=f"weather in {city}", expected_outcome="a forecast",
                                    turns=[Turn(role="user", content=f"Weather in {city}?")])
               for city in ("Paris", "Rome")]
    with TracedConversations(provider) as traced:
        simulated = ConversationSimulator(model_callback=agent).simulate(goldens)
    cases = traced.test_cases(simulated)
    for case, city in zip(cases, ("Paris", "Rome"), strict=True):
        assert case.scenario == f"weather in {city}" and case.expected_outcome == "a forecast"
        [calls] = [t.mcp_tools_called for t in case.turns if t.mcp_tools_called]
        assert [(c.name, c.args) for c in calls] == [("get_forecast", {"city": city})]
        assert case.metadata["simulation"]["traced"] == "1 traces" and case.turns[0].content == f"Weather in {city}?"
    # a conversation whose agent recorded no span keeps its simulated turns and says why
    [plain] = traced.test_cases(ConversationSimulator(model_callback=lambda input: "hi").simulate(goldens[:1]))
    assert "no span of the agent" in plain.metadata["simulation"]["traced"]
