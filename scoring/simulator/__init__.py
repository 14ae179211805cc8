"""DeepEval's conversation simulator, at DeepEval's path (`from tracejudge.simulator import ConversationSimulator`)."""

from tracejudge.simulator.controller import Decision, end, proceed
from tracejudge.simulator.simulator import CONVERSATION_ID, THREAD_ID, ConversationSimulator, SimulationError
from tracejudge.simulator.template import ConversationSimulatorTemplate

__all__ = ["CONVERSATION_ID", "THREAD_ID", "ConversationSimulator", "ConversationSimulatorTemplate", "Decision",
           "SimulationError", "end", "proceed"]
