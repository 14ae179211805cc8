"""DeepEval's path to the multi-turn test case (`deepeval.test_case.conversational_test_case`)."""

from __future__ import annotations

from enum import Enum

from tracejudge.lazy_names import deprecated_getattr
from tracejudge.test_case import ConversationalTestCase, Turn

__all__ = ["ConversationalTestCase", "MultiTurnParams", "Turn"]


class MultiTurnParams(Enum):
    """The fields of a conversation a metric can ask for (DeepEval's `MultiTurnParams`, formerly `TurnParams`)."""

    ROLE = "role"
    CONTENT = "content"
    METADATA = "metadata"
    TAGS = "tags"
    SCENARIO = "scenario"
    EXPECTED_OUTCOME = "expected_outcome"
    CONTEXT = "context"
    USER_DESCRIPTION = "user_description"
    RETRIEVAL_CONTEXT = "retrieval_context"
    CHATBOT_ROLE = "chatbot_role"
    TOOLS_CALLED = "tools_called"
    MCP_TOOLS = "mcp_tools_called"
    MCP_RESOURCES = "mcp_resources_called"
    MCP_PROMPTS = "mcp_prompts_called"


DEPRECATED = {"TurnParams": ("MultiTurnParams", MultiTurnParams)}  # DeepEval's older name


__getattr__ = deprecated_getattr(__name__, DEPRECATED)
