"""`tracejudge export`: scores and conversations as Parquet files."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

import duckdb

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.durations import DurationError, parse_since
from tracejudge.collector.history.output_paths import OutputPathError, confined
from tracejudge.dataset import human_verdicts


def run(args: argparse.Namespace) -> int:
    try:
        since = parse_since(args.since, dt.datetime.now(dt.UTC).date())
    except DurationError as exc:
        print(f"tracejudge export: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    db = Path(args.db or os.environ.get("TRACEJUDGE_DB") or "tracejudge.duckdb")
    out = Path(args.to)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        targets = {table: confined(out, f"{table}.parquet") for table in ("scores", "conversations")}
    except OutputPathError as exc:
        print(f"tracejudge export: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        with duckdb.connect(str(db), read_only=True) as con:
            for table, column in (("scores", "scored_at"), ("conversations", "assembled_at")):
                target = targets[table]
                quoted = str(target).replace("'", "''")
                con.execute(f"COPY (SELECT * FROM {table} WHERE {column} >= DATE '{since.isoformat()}') "
                            f"TO '{quoted}' (FORMAT parquet)")
                [(rows,)] = con.execute(f"SELECT count(*) FROM read_parquet('{quoted}')").fetchall()
                written.append(f"{target} ({rows} rows)")
    except duckdb.Error as exc:
        print(f"tracejudge export: cannot export from {db}: {exc}; stop the collector first if it holds the file",
              file=sys.stderr)
        return EXIT_FAIL
    if args.reviews:
        try:
            written.append(_export_reviews(db, confined(out, "reviews.jsonl"), since))
        except (OutputPathError, duckdb.Error) as exc:
            print(f"tracejudge export: cannot export the reviews from {db}: {exc}", file=sys.stderr)
            return EXIT_FAIL
    print("wrote " + ", ".join(written))
    return EXIT_PASS


def _part_verdicts(reviews: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, bool]]]:
    """Per metric, the reviewers' majority on each task (`task_verdicts`) and MCP call (`call_verdicts`) they
    labelled, by the index in the score's breakdown: True where the task was done or the call valid."""
    votes = [(f"{kind}\t{r['metric']}\t{part['index']}", part["human_pass"]) for r in reviews
             for kind, parts in json.loads(r["labels"] or "{}").items() for part in parts]
    out: dict[str, dict[str, dict[str, bool]]] = {"task_verdicts": {}, "call_verdicts": {}}
    for key, passed in human_verdicts(votes).items():
        kind, metric, index = key.split("\t")
        out["task_verdicts" if kind == "tasks" else "call_verdicts"].setdefault(metric, {})[index] = passed
    return out


def _export_reviews(db: Path, target: Path, since: dt.date) -> str:
    """Reviewed conversations as a labelled corpus (the rows of bench/validity/corpus.jsonl, labelled per metric by
    the majority of its reviewers, a tie counting as a fail), for `python bench/validity.py --corpus FILE`."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT r.conversation_id, r.conversation_version, any_value(c.test_case), list(struct_pack("
            "metric := r.metric, reviewer := r.reviewer, human_pass := r.human_pass, human_score := r.human_score, "
            "judge_success := r.judge_success, note := r.note, labels := r.labels) ORDER BY r.reviewed_at) "
            "FROM reviews r JOIN "
            "conversations c ON c.conversation_id = r.conversation_id AND c.version = r.conversation_version "
            "WHERE r.reviewed_at >= ? GROUP BY 1, 2 ORDER BY 1, 2", [since]).fetchall()
    with target.open("w", encoding="utf-8") as out:
        for conversation_id, version, test_case, reviews in rows:
            verdicts = human_verdicts((r["metric"], r["human_pass"]) for r in reviews)
            labels = {"fault": "clean" if all(verdicts.values()) else "human_fail", "server": "reviewed",
                      "source": "reviews", "variant": "reviewed", "hard": False, "metrics": verdicts,
                      **_part_verdicts(reviews), "reviews": reviews}
            out.write(json.dumps({"id": f"{conversation_id}#v{version}", "labels": labels,
                                  "test_case": json.loads(test_case)}, ensure_ascii=False, sort_keys=True) + "\n")
    return f"{target} ({len(rows)} reviewed conversations)"
