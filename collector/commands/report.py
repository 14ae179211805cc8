"""`tracejudge report`: the score history as one self-contained HTML page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_PASS
from tracejudge.collector.commands.admin_client import from_collector
from tracejudge.collector.history.output_paths import OutputPathError, confined
from tracejudge.collector.ui.export import ReportError, export_views


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        target = confined(out.parent, out.name)
    except OutputPathError as exc:
        print(f"tracejudge report: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    reply = from_collector(args, lambda url, headers: httpx.get(
        f"{url}/report", params={"since": args.since}, headers=headers, timeout=120))
    if reply is not None:
        if reply.status_code != 200:
            print(f"tracejudge report: {reply.json().get('error', reply.text)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        page = reply.text
    else:
        from tracejudge.collector.commands.history_files import history  # DuckDB: only when no collector answered

        opened = history(args, "report")
        if opened is None:
            return EXIT_BAD_INPUT
        con, source = opened
        try:
            page = export_views(con, args.since, source)
        except ReportError as exc:
            print(f"tracejudge report: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        finally:
            con.close()
    target.write_text(page, encoding="utf-8")
    print(f"wrote {target} ({len(page.encode())} bytes)")
    return EXIT_PASS
