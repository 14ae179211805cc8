"""DeepEval's single-turn test case (`LLMTestCase`) and its images (`MLLMImage`), for the single-turn MCP Use
metric and the code of DeepEval users that builds them: the same fields, spellings and errors.
"""

from __future__ import annotations

import base64
import mimetypes
import os
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import unquote, urlparse

from pydantic import AliasChoices, Field, PrivateAttr, model_validator

from tracejudge.lazy_names import deprecated_getattr
from tracejudge.test_case import (
    MULTIMODAL_PLACEHOLDER,
    ConversationalTestCase,
    MCPPromptCall,
    MCPResourceCall,
    MCPServer,
    MCPToolCall,
    RetrievedContextData,
    ToolCall,
    Turn,
    _AdditionalMetadata,
    _CaseModel,
    normalize_mcp_servers,
)


class SingleTurnParams(Enum):
    """The fields of an `LLMTestCase` a metric can ask for (DeepEval's `SingleTurnParams`, formerly
    `LLMTestCaseParams`)."""

    INPUT = "input"
    ACTUAL_OUTPUT = "actual_output"
    EXPECTED_OUTPUT = "expected_output"
    CONTEXT = "context"
    RETRIEVAL_CONTEXT = "retrieval_context"
    METADATA = "metadata"
    TAGS = "tags"
    TOOLS_CALLED = "tools_called"
    EXPECTED_TOOLS = "expected_tools"
    MCP_SERVERS = "mcp_servers"
    MCP_TOOLS_CALLED = "mcp_tools_called"
    MCP_RESOURCES_CALLED = "mcp_resources_called"
    MCP_PROMPTS_CALLED = "mcp_prompts_called"


DEPRECATED = {"LLMTestCaseParams": ("SingleTurnParams", SingleTurnParams)}  # DeepEval's older names


__getattr__ = deprecated_getattr(__name__, DEPRECATED)


class ToolCallType(Enum):
    """What kind of tool a `ToolCall` called (DeepEval's): a function of the app, or an MCP server's tool."""

    FUNCTION = "FUNCTION"
    MCP = "MCP"


class ToolCallParams(Enum):
    INPUT_PARAMETERS = "input_parameters"
    OUTPUT = "output"


# placeholder id -> image, so a placeholder in text finds its image again (an f-string keeps only the
# placeholder, as DeepEval's users write them); the newest MAX_IMAGES are kept, each with its Base64 data
MAX_IMAGES = 1_000
_IMAGES: OrderedDict[str, MLLMImage] = OrderedDict()


@dataclass
class MLLMImage:
    """An image (or PDF) in a test case's text: `str(image)` is a placeholder (`[DEEPEVAL:IMAGE:id]`) that makes
    the case multimodal, so a judge that reads text only is refused for it. From a local path or `file://` URL
    (read as Base64), an `http(s)://` URL (kept as the URL), or `dataBase64` with its `mimeType`."""

    dataBase64: str | None = None  # noqa: N815 - DeepEval's spelling
    mimeType: str | None = None  # noqa: N815
    url: str | None = None
    local: bool | None = None
    filename: str | None = None
    _id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        if not self.url and not self.dataBase64:
            raise ValueError("give MLLMImage a 'url' (a path, file:// or http(s):// URL), or 'dataBase64' with "
                             "its 'mimeType'")
        if self.dataBase64 is not None:
            if self.mimeType is None:
                raise ValueError("mimeType must be provided when initializing from Base64 data")
        else:
            assert self.url is not None
            local = self.is_local_path(self.url)
            if self.local is not None and self.local != local:
                raise ValueError(f"local={self.local} but {self.url!r} is {'a local path' if local else 'a URL'}")
            self.local = local
            if local:
                path = self.process_url(self.url)
                if not os.path.exists(path):
                    raise FileNotFoundError(f"Image file not found: {path}")
                self.filename = os.path.basename(path)
                self.mimeType = mimetypes.guess_type(path)[0] or "image/jpeg"
                with open(path, "rb") as f:
                    self.dataBase64 = base64.b64encode(f.read()).decode("ascii")
            else:
                if not self.url.startswith(("http://", "https://")):
                    raise ValueError(f"Invalid remote URL format: {self.url}. URL must start with http:// or "
                                     "https://")
                self.filename = os.path.basename(urlparse(self.url).path)
                self.mimeType = mimetypes.guess_type(self.filename)[0]
        _IMAGES[self._id] = self
        while len(_IMAGES) > MAX_IMAGES:
            _IMAGES.popitem(last=False)

    @staticmethod
    def is_local_path(url: str) -> bool:
        if url.startswith("file://"):
            return True
        return urlparse(url).scheme in ("", "file") or os.path.exists(url)

    @staticmethod
    def process_url(url: str) -> str:
        return unquote(urlparse(url).path) if url.startswith("file://") else url

    def _placeholder(self) -> str:
        kind = "PDF" if self.mimeType == "application/pdf" else "IMAGE"
        return f"[DEEPEVAL:{kind}:{self._id}]"

    def __str__(self) -> str:
        return self._placeholder()

    def __repr__(self) -> str:
        return self._placeholder()

    def __format__(self, spec: str) -> str:
        return self._placeholder()


def image_of(placeholder_id: str) -> MLLMImage | None:
    """The image a placeholder in text stands for, if it was made in this process."""
    return _IMAGES.get(placeholder_id)


_STRINGS = ("input", "actual_output", "expected_output")
_STRING_LISTS = ("context", "retrieval_context")
_TOOL_LISTS = ("tools_called", "expected_tools")


class SingleTurnFields(_AdditionalMetadata, _CaseModel):
    """What a single-turn test case and a single-turn golden share (DeepEval's fields and spellings)."""

    input: str
    actual_output: str | None = None
    expected_output: str | None = None
    context: list[str] | None = None
    retrieval_context: list[str | RetrievedContextData] | None = None
    metadata: dict[str, Any] | None = Field(
        None, validation_alias=AliasChoices("metadata", "additional_metadata", "additionalMetadata"))
    tools_called: list[ToolCall] | None = None
    comments: str | None = None
    expected_tools: list[ToolCall] | None = None
    name: str | None = None


class LLMTestCase(SingleTurnFields):
    """One input and the agent's output (DeepEval's `LLMTestCase`), with the MCP servers and the calls made for
    it: what the single-turn `MCPUseMetric` judges."""

    token_cost: float | None = None
    completion_time: float | None = None
    tags: list[str] | None = None
    mcp_servers: list[MCPServer] | None = None
    mcp_tools_called: list[MCPToolCall] | None = None
    mcp_resources_called: list[MCPResourceCall] | None = None
    mcp_prompts_called: list[MCPPromptCall] | None = None
    flaky: bool = False
    _trace_dict: dict[str, Any] | None = PrivateAttr(default=None)
    _dataset_rank: int | None = PrivateAttr(default=None)
    _dataset_alias: str | None = PrivateAttr(default=None)
    _dataset_id: str | None = PrivateAttr(default=None)
    _identifier: str = PrivateAttr(default_factory=lambda: str(uuid.uuid4()))

    @model_validator(mode="before")
    @classmethod
    def _deepeval_types(cls, data: Any) -> Any:
        """DeepEval's TypeErrors for the fields its users get wrong most (a missing input stays a
        ValidationError, as there)."""
        if not isinstance(data, dict):
            return data
        given = {_snake(k): v for k, v in data.items()}
        for name in _STRINGS:
            value = given.get(name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"'{name}' must be a string")
        for name in _STRING_LISTS:
            value = given.get(name)
            allowed = (str, RetrievedContextData) if name == "retrieval_context" else (str,)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, allowed) for v in value)):
                raise TypeError(f"'{name}' must be None or a list of strings")
        for name in _TOOL_LISTS:
            value = given.get(name)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, ToolCall) for v in value)):
                raise TypeError(f"'{name}' must be None or a list of `ToolCall`")
        servers = data.get("mcp_servers", data.get("mcpServers"))
        if isinstance(servers, list | tuple):  # MCP SDK server objects are read for what they advertise
            data = {**{k: v for k, v in data.items() if k not in ("mcp_servers", "mcpServers")},
                    "mcp_servers": normalize_mcp_servers(list(servers))}
        return data

    def as_conversation(self) -> ConversationalTestCase:
        """The single turn as a conversation of one task: the input as the user's turn, the output and every
        call as the assistant's; name, tags, context and metadata kept. What the MCP metrics score."""
        assistant = Turn(role="assistant", content=self.actual_output or "", tools_called=self.tools_called,
                         mcp_tools_called=self.mcp_tools_called, mcp_resources_called=self.mcp_resources_called,
                         mcp_prompts_called=self.mcp_prompts_called, retrieval_context=self.retrieval_context)
        return ConversationalTestCase(turns=[Turn(role="user", content=self.input), assistant],
                                      mcp_servers=self.mcp_servers, context=self.context, name=self.name,
                                      tags=self.tags, metadata=self.metadata, flaky=self.flaky)

    @property
    def multimodal(self) -> bool:
        """Whether any text holds an `MLLMImage` placeholder: such a case needs a judge that reads images."""
        texts = [self.input, self.actual_output, self.expected_output, *(self.context or []),
                 *(c if isinstance(c, str) else c.context for c in self.retrieval_context or [])]
        return any(MULTIMODAL_PLACEHOLDER.search(t) for t in texts if t)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
