"""Fingerprints of everything the mapping builds, to show a change to it (a faster path, a refactor) builds the same
bytes: every conversation of every recorded framework fixture (`tests/fixtures/real`, traces with their log files),
plain and with `explain`, and every conversation of `bench/ingest.py`'s traffic as the assembly workers build it
(`build_batch`, with call validity; all of `Built` but the check's latency).

    python bench/mapping_fingerprints.py --write before.json     # on the code before the change
    python bench/mapping_fingerprints.py --compare before.json   # after it: exits 1 and names what differs
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.worker_build import stored_batch  # noqa: E402
from tracejudge.collector.input_files import read_otlp_files  # noqa: E402
from tracejudge.collector.pipeline.assembly.conversation_builder import BuildConfig, build_batch  # noqa: E402
from tracejudge.collector.pipeline.assembly.span_columns import ArrowColumns  # noqa: E402
from tracejudge.mapping import build_conversations  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "real"


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=lambda o: sorted(o) if isinstance(o, set | frozenset) else str(o))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fixtures() -> dict[str, str]:
    """Each recorded conversation's document, plain and explained."""
    out = {}
    for trace_file in sorted(FIXTURES.glob("*.otlp.json")):
        if trace_file.name.endswith(".logs.otlp.json"):
            continue
        logs = trace_file.with_name(trace_file.name.replace(".otlp.json", ".logs.otlp.json"))
        spans = read_otlp_files([trace_file, *([logs] if logs.exists() else [])], on_problem=lambda _: None)
        for explain in (False, True):
            for conversation in build_conversations(spans, explain=explain):
                out[f"{trace_file.name} {conversation.conversation_id} explain={explain}"] = _digest(
                    conversation.document(explain))
    return out


def bench_traffic(requests: int) -> dict[str, str]:
    """`bench/ingest.py`'s conversations stored, read back as the assembler reads them, and built."""
    table, conversations, scopes, resources = stored_batch(requests)
    result = build_batch(ArrowColumns(table), conversations, scopes, resources,
                         BuildConfig(checks=("mcp_call_validity",)))
    out = {f"bench {cid} failed": _digest(reason) for cid, reason in result.failed.items()}
    for cid, built in result.built.items():
        document = dataclasses.asdict(built) if built is not None else None
        for check in (document or {}).get("checks", {}).values():
            if check:
                check.pop("latency_ms", None)
        out[f"bench {cid}"] = _digest(document)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", metavar="FILE", help="write the fingerprints to FILE")
    what.add_argument("--compare", metavar="FILE", help="compare with FILE's fingerprints; exit 1 on any difference")
    parser.add_argument("--requests", type=int, default=4, help="bench/ingest.py requests of 512 spans (default 4)")
    args = parser.parse_args()
    prints = {**fixtures(), **bench_traffic(args.requests)}
    if args.write:
        Path(args.write).write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n")
        print(f"{len(prints)} fingerprints written to {args.write}")
        return
    before = json.loads(Path(args.compare).read_text())
    differ = sorted(k for k in before.keys() | prints.keys() if before.get(k) != prints.get(k))
    for key in differ[:50]:
        print(f"differs: {key} ({before.get(key, 'absent')} -> {prints.get(key, 'absent')})")
    print(f"{len(prints)} fingerprints, {len(differ)} differ from {args.compare}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
