"""`tracejudge inspect`: how a trace file maps to conversations, or how a running collector maps a stored
conversation (by its id), and with --explain, from which spans."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import quote

import httpx

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_PASS
from tracejudge.collector.commands.admin_client import admin_headers
from tracejudge.collector.config import ConfigError, load_settings
from tracejudge.collector.input_files import InputFileError, read_otlp_files
from tracejudge.collector.server_file import ServerFileError, read_server_file
from tracejudge.mapping import Conversation, build_conversations


def _describe(conversation: Conversation) -> str:
    c, tc = conversation, conversation.test_case
    lines = [f"conversation {c.conversation_id} (from {c.key}; service {c.service_name or '-'}, "
             f"agent {c.agent_name or '-'}, {len(c.trace_ids)} trace(s), {len(tc.turns)} turn(s))"]
    for i, turn in enumerate(tc.turns):
        lines.append(f"  [{i}] {turn.role}: {turn.content}")
        for call in turn.mcp_tools_called or []:
            result = call.result
            text = " ".join(b.text or f"[{b.type}]" for b in result.content) if result else "(no result)"
            flag = " ERROR" if result and result.is_error else ""
            lines.append(f"      MCP tool {call.name} {json.dumps(call.args, ensure_ascii=False)} ->{flag} {text}")
        for res in turn.mcp_resources_called or []:
            lines.append(f"      MCP resource {res.uri}" + ("" if res.result else " (no result)"))
        for prompt in turn.mcp_prompts_called or []:
            lines.append(f"      MCP prompt {prompt.name} {json.dumps(prompt.args, ensure_ascii=False)}")
        for tool in turn.tools_called or []:
            lines.append(f"      function {tool.name} {json.dumps(tool.input_parameters, ensure_ascii=False)}")
        for asked in (turn.metadata or {}).get("calls_not_executed", []):
            lines.append(f"      requested, never executed: {asked['name']} "
                         f"{json.dumps(asked['args'], ensure_ascii=False)}")
    for server in tc.mcp_servers or []:
        names = ", ".join(t.name for t in server.available_tools) or "-"
        lines.append(f"  server {server.server_name}: tools {names}; {len(server.available_resources)} resource(s), "
                     f"{len(server.available_prompts)} prompt(s)")
    return "\n".join(lines)


def _explain(conversation: Conversation) -> str:
    """Where each turn and call came from: the span, the dialect that read it, and the MCP rule that decided."""
    lines = [f"conversation {conversation.conversation_id}: where each turn and call came from"]
    for entry in conversation.explanation:
        turn = '-' if entry['turn'] is None else entry['turn']
        lines.append(f"  [{turn}] {entry['role']}: {entry.get('source') or '(no text)'}")
        for call in entry.get("calls") or []:
            lines.append(f"      {call['kind']} {call['name']} (call id {call.get('call_id') or '-'}): "
                         f"{call['counted_as']}")
            if call.get("mcp_rule"):
                lines.append(f"        MCP because: {call['mcp_rule']}")
            if call.get("result_envelope"):
                lines.append(f"        result unwrapped from: {call['result_envelope']}")
            lines.extend(f"        from {source}" for source in call["sources"])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    paths = [Path(f) for f in args.files]
    missing = [p for p in paths if not p.exists()]
    if len(paths) == 1 and missing:
        return _from_collector(args)
    if missing:
        print(f"tracejudge inspect: no such file: {', '.join(map(str, missing))} (a conversation id is looked up "
              "alone, without files)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        spans = read_otlp_files(paths)
        servers = read_server_file(Path(args.servers)) if args.servers else None
        settings = load_settings()
        redactor = settings.redaction.redactor()
    except (InputFileError, ServerFileError, ConfigError) as exc:
        print(f"tracejudge inspect: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    conversations = build_conversations(redactor.spans(spans) if redactor is not None else spans, servers,
                                        mcp_tools=settings.mapping.mcp_tools, explain=args.explain)
    _print(conversations, args, f"no conversation in {len(spans)} span(s)")
    return EXIT_PASS


def _print(conversations: list[Conversation], args: argparse.Namespace, nothing: str) -> None:
    if args.format == "json":
        print(json.dumps([c.document(args.explain) for c in conversations], indent=2, ensure_ascii=False))
    else:
        texts = [_describe(c) + ("\n" + _explain(c) if args.explain else "") for c in conversations]
        print("\n\n".join(texts) or nothing)


def _from_collector(args: argparse.Namespace) -> int:
    """A conversation id: the running collector maps its stored spans again (always with where each part came
    from; --explain prints it)."""
    conversation_id = args.files[0]
    url = f"{args.url.rstrip('/')}/api/conversations/{quote(conversation_id, safe='')}/mapping"
    try:
        reply = httpx.get(url, headers=admin_headers(), timeout=120)
    except httpx.HTTPError as exc:
        print(f"tracejudge inspect: {conversation_id} is no file, and no collector answered at {args.url} to look "
              f"it up as a conversation id ({type(exc).__name__}); start one or pass --url", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        body = reply.json()
    except ValueError:
        body = None
    if reply.status_code != 200 or not isinstance(body, dict):
        error = body.get("error") if isinstance(body, dict) else None
        print(f"tracejudge inspect: the collector at {args.url} answered {reply.status_code}: "
              f"{error or reply.text[:300]}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _print([Conversation.from_document(body)], args, "")
    return EXIT_PASS
