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

from pydantic import AliasChoices, Field, ValidationError, model_validator

from tracejudge.dataset_records import (
    LIST_DELIMITER,
    context_in,
    context_out,
    csv_cell,
    from_csv_cell,
    turns_in,
)
from tracejudge.errors import TracejudgeError
from tracejudge.persona import (  # noqa: F401 - DeepEval users import the persona types from the dataset module
    BackgroundNoiseSettings,
    InterruptionBehavior,
    Persona,
    resolve_persona,
)
from tracejudge.test_case import (
    ConversationalTestCase,
    LLMTestCase,
    ToolCall,
    Turn,
    _AdditionalMetadata,
    _CaseModel,
    load_test_case,
)
from tracejudge.test_case.llm_test_case import SingleTurnFields

if TYPE_CHECKING:  # the library imports DuckDB only to read a collector's history
    import duckdb

FileType = Literal["json", "jsonl", "csv"]
SINGLE_TURN_COLUMNS = ("input", "actual_output", "expected_output", "retrieval_context", "context", "name",
                       "comments", "source_file", "tools_called", "expected_tools", "additional_metadata",
                       "custom_column_key_values")
MULTI_TURN_COLUMNS = ("scenario", "turns", "expected_outcome", "user_description", "context", "name", "comments",
                      "additional_metadata", "custom_column_key_values")


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
    custom_column_key_values: dict[str, str] | None = None
    persona: Persona | None = None  # who the simulated user is; `user_description` is its older, text-only form

    @model_validator(mode="after")
    def _persona_in_step(self) -> ConversationalGolden:
        self.__dict__["persona"], self.__dict__["user_description"] = resolve_persona(self.persona,
                                                                                      self.user_description)
        return self

    @classmethod
    def from_test_case(cls, case: ConversationalTestCase) -> ConversationalGolden:
        """The case as a golden; its scenario, else its first user turn, is the scenario."""
        first_user = next((t.content for t in case.turns if t.role == "user"), "")
        persona = Persona(characteristics=case.user_description) if case.user_description is not None else None
        return cls(scenario=case.scenario or first_user, expected_outcome=case.expected_outcome, persona=persona,
                   context=case.context, turns=case.turns, name=case.name, comments=case.comments,
                   metadata=case.metadata)


class Golden(SingleTurnFields):
    """One input to run a single-turn agent on, with what should come of it (DeepEval's `Golden`)."""

    source_file: str | None = None
    custom_column_key_values: dict[str, str] | None = None

    @classmethod
    def from_test_case(cls, case: LLMTestCase) -> Golden:
        return cls(input=case.input, actual_output=case.actual_output, expected_output=case.expected_output,
                   context=case.context, retrieval_context=case.retrieval_context, metadata=case.metadata,
                   comments=case.comments, tools_called=case.tools_called, expected_tools=case.expected_tools,
                   name=case.name)


AnyGolden = Golden | ConversationalGolden
GOLDEN_FIELDS = set(Golden.model_fields) | set(ConversationalGolden.model_fields) | {"additional_metadata"}


def _record(golden: AnyGolden) -> dict[str, Any]:
    """A golden as DeepEval writes it: its fields, `additional_metadata`, retrieval context as markers, tool calls
    with their type."""
    record = golden.model_dump(mode="json", exclude={"metadata"})
    record["additional_metadata"] = golden.metadata
    if isinstance(golden, Golden):
        record["retrieval_context"] = context_out(golden.retrieval_context)
        for key in ("tools_called", "expected_tools"):
            record[key] = _tool_records(getattr(golden, key))
    elif golden.turns is not None:
        record["turns"] = [{**t.model_dump(mode="json", exclude={"metadata"}), "additional_metadata": t.metadata,
                            "retrieval_context": context_out(t.retrieval_context),
                            "tools_called": _tool_records(t.tools_called)} for t in golden.turns]
    return record


def _tool_records(calls: list[ToolCall] | None) -> list[dict[str, Any]] | None:
    if calls is None:
        return None
    return [{**c.model_dump(mode="json", exclude_none=True), "type": c.type or "FUNCTION"} for c in calls]



class EvaluationDataset:
    """Goldens and test cases, all single-turn or all multi-turn (DeepEval's rule); `evaluate(dataset.test_cases,
    metrics)` scores the cases."""

    def __init__(self, goldens: Sequence[AnyGolden | dict[str, Any]] | None = None,
                 test_cases: Sequence[ConversationalTestCase | LLMTestCase | dict[str, Any]] | None = None) -> None:
        self.goldens: list[Any] = []
        self.test_cases: list[Any] = []
        self._multi_turn: bool | None = None  # decided by the first golden or test case
        for golden in goldens or []:
            self.add_golden(golden)
        for case in test_cases or []:
            self.add_test_case(case)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.goldens)

    def __len__(self) -> int:
        return len(self.goldens)

    def _kind(self, multi_turn: bool, what: str) -> None:
        if self._multi_turn is None:
            self._multi_turn = multi_turn
        elif self._multi_turn != multi_turn:
            raise TypeError(f"You cannot add '{what}' to a {'multi' if self._multi_turn else 'single'}-turn "
                            "dataset.")

    def add_golden(self, golden: AnyGolden | dict[str, Any]) -> None:
        if isinstance(golden, dict):
            golden = ConversationalGolden.model_validate(golden) if "scenario" in golden and "input" not in golden \
                else Golden.model_validate(golden)
        self._kind(isinstance(golden, ConversationalGolden), type(golden).__name__)
        self.goldens.append(golden)

    def add_test_case(self, test_case: ConversationalTestCase | LLMTestCase | dict[str, Any]) -> None:
        if isinstance(test_case, dict) and "input" in test_case and "turns" not in test_case:
            test_case = LLMTestCase.model_validate(test_case)
        if isinstance(test_case, LLMTestCase):
            self._kind(False, "LLMTestCase")
            self.test_cases.append(test_case)
            return
        self._kind(True, "ConversationalTestCase")
        self.test_cases.append(load_test_case(test_case))

    # --- files -------------------------------------------------------------------------------------------

    def save_as(self, file_type: FileType, directory: str | Path, file_name: str | None = None,
                include_test_cases: bool = False) -> str:
        """Write the goldens (and the test cases, as goldens) to one file, as DeepEval writes them; its path."""
        if file_type not in ("json", "jsonl", "csv"):
            raise DatasetError(f"file_type must be 'json', 'jsonl' or 'csv', not {file_type!r}")
        goldens = list(self.goldens)
        if include_test_cases:
            goldens += [Golden.from_test_case(c) if isinstance(c, LLMTestCase)
                        else ConversationalGolden.from_test_case(c) for c in self.test_cases]
        if not goldens:
            raise DatasetError("No goldens found in the dataset to save (add some, or pass include_test_cases=True "
                               "with test cases)")
        name = file_name or dt.datetime.now(dt.UTC).strftime("%Y%m%d_%H%M%S")
        path = Path(directory) / f"{name}.{file_type}"
        path.parent.mkdir(parents=True, exist_ok=True)
        records = [_record(g) for g in goldens]
        columns = MULTI_TURN_COLUMNS if isinstance(goldens[0], ConversationalGolden) else SINGLE_TURN_COLUMNS
        with path.open("w", encoding="utf-8", newline="") as out:
            if file_type == "json":
                json.dump(records, out, ensure_ascii=False, indent=2)
            elif file_type == "jsonl":
                out.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
            else:
                writer = csv.writer(out)
                writer.writerow(columns)
                writer.writerows([csv_cell(c, r.get(c)) for c in columns] for r in records)
        return str(path)

    def add_goldens_from_json_file(self, file_path: str | Path, encoding_type: str = "utf-8",
                                   **key_names: str | None) -> None:
        """A JSON list of goldens, or JSON Lines (one golden per line); single-turn or multi-turn by their fields.
        `<field>_key_name=` reads a field from a key otherwise named (DeepEval's arguments)."""
        text = _read(file_path, encoding_type)
        try:
            records = json.loads(text) if text.lstrip().startswith("[") else \
                [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{file_path} is not JSON or JSON Lines: {exc}") from exc
        renamed = {key: _field_of(arg, "_key_name") for arg, key in key_names.items() if key}
        if renamed and isinstance(records, list):
            records = [{renamed.get(k, k): v for k, v in r.items()} if isinstance(r, dict) else r for r in records]
        self._add_records(records, file_path)

    add_goldens_from_jsonl_file = add_goldens_from_json_file

    def add_goldens_from_csv_file(self, file_path: str | Path, input_col_name: str | None = "input",
                                  actual_output_col_name: str | None = "actual_output",
                                  expected_output_col_name: str | None = "expected_output",
                                  context_col_name: str | None = "context",
                                  context_col_delimiter: str = LIST_DELIMITER,
                                  retrieval_context_col_name: str | None = "retrieval_context",
                                  retrieval_context_col_delimiter: str = LIST_DELIMITER,
                                  **more_columns: str | None) -> None:
        """A CSV file as DeepEval and `save_as("csv")` write it: list columns (`context`, `retrieval_context`)
        joined with their delimiter, structured ones as JSON; DeepEval's arguments name columns otherwise named
        (`<field>_col_name=`, `<field>_key_name=`; its tool-call delimiters are accepted, tool cells being JSON).
        An absent column leaves its field None; a column that is no field of a golden is left out."""
        names = {"input": input_col_name, "actual_output": actual_output_col_name,
                 "expected_output": expected_output_col_name, "context": context_col_name,
                 "retrieval_context": retrieval_context_col_name}
        for arg, column in more_columns.items():
            if arg.endswith("_col_delimiter"):
                continue
            names[_field_of(arg, "_key_name" if arg.endswith("_key_name") else "_col_name")] = column
        records = _csv_records(file_path, {f: c for f, c in names.items() if c},
                               delimiters={"context": context_col_delimiter,
                                           "retrieval_context": retrieval_context_col_delimiter},
                               keep=GOLDEN_FIELDS)
        self._add_records(records, file_path)

    def add_test_cases_from_csv_file(self, file_path: str | Path, input_col_name: str = "input",
                                     actual_output_col_name: str = "actual_output",
                                     expected_output_col_name: str = "expected_output",
                                     context_col_name: str = "context", context_col_delimiter: str = LIST_DELIMITER,
                                     retrieval_context_col_name: str = "retrieval_context",
                                     retrieval_context_col_delimiter: str = LIST_DELIMITER,
                                     tools_called_col_name: str = "tools_called",
                                     expected_tools_col_name: str = "expected_tools",
                                     additional_metadata_col_name: str = "additional_metadata") -> None:
        """Single-turn test cases from a CSV file (DeepEval's loader, with its column-name arguments)."""
        names = {"input": input_col_name, "actual_output": actual_output_col_name,
                 "expected_output": expected_output_col_name, "context": context_col_name,
                 "retrieval_context": retrieval_context_col_name, "tools_called": tools_called_col_name,
                 "expected_tools": expected_tools_col_name, "additional_metadata": additional_metadata_col_name}
        for record in _csv_records(file_path, names, delimiters={"context": context_col_delimiter,
                                                                  "retrieval_context": retrieval_context_col_delimiter},
                                   keep=set(names), empty_lists=True):
            fields = {k: v for k, v in record.items() if k in names}
            try:
                for key in ("tools_called", "expected_tools"):  # JSON cells: DeepEval's test case wants ToolCalls
                    if isinstance(fields.get(key), list):
                        fields[key] = [ToolCall.model_validate(call) for call in fields[key]]
                self.add_test_case(LLMTestCase(**fields))
            except (ValidationError, TypeError) as exc:
                raise DatasetError(f"{file_path}: a row is not a test case: {str(exc).splitlines()[0]}") from exc

    def _add_records(self, records: Any, source: str | Path) -> None:
        if not isinstance(records, list):
            raise DatasetError(f"{source} must hold a list of goldens")
        problems, goldens = [], []
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                problems.append(f"record {i}: not a JSON object")
                continue
            record = {k: v for k, v in record.items() if v is not None}
            description = record.get("user_description", record.get("userDescription"))
            if isinstance(description, str) and "persona" not in record:  # a file's text is no deprecated call
                record["persona"] = {"characteristics": description}
            if "turns" in record:
                record["turns"] = turns_in(record["turns"])
            if "retrieval_context" in record:
                record["retrieval_context"] = context_in(record["retrieval_context"])
            try:
                goldens.append(Golden.model_validate(record) if "input" in record
                               else ConversationalGolden.model_validate(record))
            except ValidationError as exc:
                problems.append(f"record {i}: {str(exc).splitlines()[0]}")
        if problems:
            raise DatasetError(f"{source}: {len(problems)} invalid golden(s): " + "; ".join(problems[:10]))
        kind = self._multi_turn
        for golden in goldens:  # DeepEval's TypeError for a golden of the other kind, before any is added
            multi = isinstance(golden, ConversationalGolden)
            if kind is not None and kind != multi:
                raise TypeError(f"You cannot add '{type(golden).__name__}' to a {'multi' if kind else 'single'}-"
                                "turn dataset.")
            kind = multi
        for golden in goldens:
            self.add_golden(golden)

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
        dataset._multi_turn = True
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
        dataset._multi_turn = True
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


def _field_of(argument: str, suffix: str) -> str:
    if not argument.endswith(suffix):
        raise TypeError(f"unexpected argument {argument!r}: name a column or key as <field>{suffix}=...")
    return argument.removesuffix(suffix)


def _csv_records(file_path: str | Path, names: dict[str, str], delimiters: dict[str, str], keep: set[str],
                 empty_lists: bool = False) -> list[dict[str, Any]]:
    """Each CSV row as a record of the fields in `keep` (`names`: field -> column, for columns named
    otherwise); an empty list cell is an empty list with `empty_lists` (DeepEval's test-case loader), else no
    value (a golden saved with none reads back with none); a cell that is not JSON where JSON is due is the
    file's error, with its line."""
    rows = list(csv.DictReader(io.StringIO(_read(file_path), newline="")))  # cells may hold newlines
    field_of = {column: field for field, column in names.items()}
    columns = {field_of.get(c, c): c for c in (rows[0].keys() if rows else ())}
    columns = {field: column for field, column in columns.items() if field in keep}
    records = []
    for number, row in enumerate(rows, start=2):
        record: dict[str, Any] = {}
        for field, column in columns.items():
            text = row.get(column) or ""
            try:
                value = from_csv_cell(field, text, delimiters.get(field, LIST_DELIMITER))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{file_path} line {number}: column {column} is not JSON: {exc}") from exc
            if value is not None and value != "" and (value != [] or empty_lists):
                record[field] = value
        for field in ("input", "scenario"):  # an empty cell of the other kind's key column is no key
            if record.get(field) in ("", None):
                record.pop(field, None)
        records.append(record)
    return records


def _read(file_path: str | Path, encoding: str = "utf-8") -> str:
    try:
        return Path(file_path).read_text(encoding=encoding)
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {file_path}: {exc}") from exc
