"""Goldens and datasets in DeepEval's shape: scenarios to replay against an agent and the conversations that came
back, kept as JSON, JSON Lines or CSV, or taken from the collector's history ("every failing conversation of
the last week").
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AliasChoices, Field, ValidationError

from tracejudge.errors import TracejudgeError
from tracejudge.test_case import ConversationalTestCase, Turn, _AdditionalMetadata, _CaseModel, load_test_case

if TYPE_CHECKING:  # the library imports DuckDB only to read a collector's history
    import duckdb

FileType = Literal["json", "jsonl", "csv"]
_CSV_COLUMNS = ("scenario", "expected_outcome", "user_description", "context", "turns", "name", "comments",
                "metadata")
_JSON_COLUMNS = frozenset({"context", "turns", "metadata"})  # CSV cells holding JSON


class DatasetError(TracejudgeError, ValueError):
    """A dataset file cannot be read or written, or a record in it does not validate. A ValueError, as DeepEval's
    dataset errors are, so `except ValueError` written for DeepEval still catches it."""


class ConversationalGolden(_AdditionalMetadata, _CaseModel):
    """A scenario to evaluate an agent on: what the user wants, what should come of it, and the turns so far."""

    scenario: str
    expected_outcome: str | None = None
    user_description: str | None = None
    context: list[str] | None = None
    turns: list[Turn] | None = None
    name: str | None = None
    comments: str | None = None
    metadata: dict[str, Any] | None = Field(
        None, validation_alias=AliasChoices("metadata", "additional_metadata", "additionalMetadata"))

    @classmethod
    def from_test_case(cls, case: ConversationalTestCase) -> ConversationalGolden:
        """The case as a golden; its scenario, else its first user turn, is the scenario."""
        first_user = next((t.content for t in case.turns if t.role == "user"), "")
        return cls(scenario=case.scenario or first_user, expected_outcome=case.expected_outcome,
                   user_description=case.user_description, context=case.context, turns=case.turns,
                   name=case.name, comments=case.comments, metadata=case.metadata)


class EvaluationDataset:
    """Goldens and test cases; `evaluate(dataset.test_cases, metrics)` scores the cases."""

    def __init__(self, goldens: Sequence[ConversationalGolden | dict[str, Any]] | None = None,
                 test_cases: Sequence[ConversationalTestCase | dict[str, Any]] | None = None) -> None:
        self.goldens: list[ConversationalGolden] = []
        self.test_cases: list[ConversationalTestCase] = []
        for golden in goldens or []:
            self.add_golden(golden)
        for case in test_cases or []:
            self.add_test_case(case)

    def __iter__(self) -> Iterator[ConversationalGolden]:
        return iter(self.goldens)

    def __len__(self) -> int:
        return len(self.goldens)

    def add_golden(self, golden: ConversationalGolden | dict[str, Any]) -> None:
        self.goldens.append(golden if isinstance(golden, ConversationalGolden)
                            else ConversationalGolden.model_validate(golden))

    def add_test_case(self, test_case: ConversationalTestCase | dict[str, Any]) -> None:
        self.test_cases.append(load_test_case(test_case))

    # --- files -------------------------------------------------------------------------------------------

    def save_as(self, file_type: FileType, directory: str | Path, file_name: str | None = None,
                include_test_cases: bool = False) -> str:
        """Write the goldens (and the test cases, as goldens with their turns) to one file; its path."""
        if file_type not in ("json", "jsonl", "csv"):
            raise DatasetError(f"file_type must be 'json', 'jsonl' or 'csv', not {file_type!r}")
        goldens = self.goldens + ([ConversationalGolden.from_test_case(c) for c in self.test_cases]
                                  if include_test_cases else [])
        if not goldens:
            raise DatasetError("the dataset has no goldens to save (add some, or pass include_test_cases=True)")
        name = file_name or dt.datetime.now(dt.UTC).strftime("%Y%m%d_%H%M%S")
        path = Path(directory) / f"{name}.{file_type}"
        path.parent.mkdir(parents=True, exist_ok=True)
        records = [g.model_dump(mode="json", exclude_none=True) for g in goldens]
        with path.open("w", encoding="utf-8", newline="") as out:
            if file_type == "json":
                json.dump(records, out, ensure_ascii=False, indent=2)
            elif file_type == "jsonl":
                out.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
            else:
                writer = csv.DictWriter(out, fieldnames=_CSV_COLUMNS)
                writer.writeheader()
                for record in records:
                    writer.writerow({k: json.dumps(v, ensure_ascii=False) if k in _JSON_COLUMNS else v
                                     for k, v in record.items()})
        return str(path)

    def add_goldens_from_json_file(self, file_path: str | Path) -> None:
        """A JSON list of goldens, or JSON Lines (one golden per line)."""
        text = _read(file_path)
        try:
            records = json.loads(text) if text.lstrip().startswith("[") else \
                [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{file_path} is not JSON or JSON Lines: {exc}") from exc
        self._add_records(records, file_path)

    add_goldens_from_jsonl_file = add_goldens_from_json_file

    def add_goldens_from_csv_file(self, file_path: str | Path) -> None:
        """A CSV file with the columns `save_as("csv")` writes; `context`, `turns` and `metadata` hold JSON."""
        rows = list(csv.DictReader(io.StringIO(_read(file_path), newline="")))  # cells may hold newlines
        records = []
        for number, row in enumerate(rows, start=2):
            record: dict[str, Any] = {}
            for key, value in row.items():
                if not value:
                    continue
                try:
                    record[key] = json.loads(value) if key in _JSON_COLUMNS else value
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{file_path} line {number}: column {key} is not JSON: {exc}") from exc
            records.append(record)
        self._add_records(records, file_path)

    def _add_records(self, records: Any, source: str | Path) -> None:
        if not isinstance(records, list):
            raise DatasetError(f"{source} must hold a list of goldens")
        problems, goldens = [], []
        for i, record in enumerate(records):
            try:
                goldens.append(ConversationalGolden.model_validate(record))
            except (ValidationError, TypeError) as exc:
                problems.append(f"record {i}: {str(exc).splitlines()[0]}")
        if problems:
            raise DatasetError(f"{source}: {len(problems)} invalid golden(s): " + "; ".join(problems[:10]))
        self.goldens.extend(goldens)

    # --- history -----------------------------------------------------------------------------------------

    @classmethod
    def from_history(cls, db: str | Path | duckdb.DuckDBPyConnection, since: dt.timedelta = dt.timedelta(days=7),
                     failing_only: bool = True, reviewed_only: bool = False) -> EvaluationDataset:
        """The conversations the collector stored in the last `since` (only those whose latest score failed a
        metric, by default), as test cases and as goldens, named by conversation id. `reviewed_only`: the
        conversation versions people reviewed in that time instead, each with `metadata["human_verdicts"]` (per
        metric, the reviewers' majority; a tie is a fail)."""
        try:
            import duckdb
        except ImportError as exc:
            raise DatasetError("reading a collector's history needs DuckDB, which the collector installs: "
                               "pip install tracejudge (or duckdb)") from exc
        opened = isinstance(db, str | Path)  # else a connection (or the collector's cursor) the caller keeps
        con = duckdb.connect(str(db), read_only=True) if opened else db
        try:
            if reviewed_only:
                return cls._reviewed(con, since)
            rows = con.execute(
                "WITH latest AS (SELECT conversation_id, version, test_case FROM conversations WHERE assembled_at >= ? "
                "AND status <> 'context_only' "  # MCP calls made outside any run: no conversation to test
                "QUALIFY row_number() OVER (PARTITION BY conversation_id ORDER BY version DESC) = 1) "
                "SELECT l.conversation_id, l.version, l.test_case, (SELECT list(s.metric ORDER BY s.metric) "
                "FROM latest_scores s WHERE s.conversation_id = l.conversation_id "
                "AND s.conversation_version = l.version AND s.success = false) FROM latest l "
                "ORDER BY l.conversation_id", [dt.datetime.now(dt.UTC) - since]).fetchall()
        except duckdb.CatalogException as exc:
            raise DatasetError(f"{db} has no tracejudge history ({str(exc).splitlines()[0]})") from exc
        finally:
            if opened:
                con.close()
        dataset = cls()
        for conversation_id, version, test_case, failed in rows:
            if failing_only and not failed:
                continue
            case = load_test_case(test_case)
            case.name = case.name or conversation_id
            case.metadata = {**(case.metadata or {}), "conversation_id": conversation_id,
                             "conversation_version": version, "failed_metrics": list(failed or [])}
            dataset.test_cases.append(case)
            dataset.goldens.append(ConversationalGolden.from_test_case(case))
        return dataset

    @classmethod
    def _reviewed(cls, con: duckdb.DuckDBPyConnection, since: dt.timedelta) -> EvaluationDataset:
        rows = con.execute(
            "SELECT r.conversation_id, r.conversation_version, any_value(c.test_case), list(struct_pack(metric := "
            "r.metric, human_pass := r.human_pass) ORDER BY r.reviewed_at) FROM reviews r JOIN conversations c ON "
            "c.conversation_id = r.conversation_id AND c.version = r.conversation_version WHERE r.reviewed_at >= ? "
            "GROUP BY 1, 2 ORDER BY 1, 2", [dt.datetime.now(dt.UTC) - since]).fetchall()
        dataset = cls()
        for conversation_id, version, test_case, reviews in rows:
            case = load_test_case(test_case)
            case.name = case.name or conversation_id
            case.metadata = {**(case.metadata or {}), "conversation_id": conversation_id,
                             "conversation_version": version,
                             "human_verdicts": human_verdicts((r["metric"], r["human_pass"]) for r in reviews)}
            dataset.test_cases.append(case)
            dataset.goldens.append(ConversationalGolden.from_test_case(case))
        return dataset


def human_verdicts(votes: Iterable[tuple[str, bool]]) -> dict[str, bool]:
    """Per metric, what most reviewers said (pass when more than half passed it: a tie is a fail)."""
    tally: dict[str, list[bool]] = {}
    for metric, passed in votes:
        tally.setdefault(metric, []).append(passed)
    return {metric: sum(passes) * 2 > len(passes) for metric, passes in tally.items()}


def _read(file_path: str | Path) -> str:
    try:
        return Path(file_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {file_path}: {exc}") from exc
