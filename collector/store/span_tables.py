"""The span tables' rows: spans in `span_records`, and their resources and instrumentation scopes stored once,
keyed by their content, instead of on every span's row.

Every span of an export request shares its resource (0.5-2 KB of JSON from a typical SDK) and its scope; stored on
each row they multiplied a small request into gigabytes (a 5 KB gzipped request of 1,000 spans under a 2 MB
scope). `spans` is a view that joins them back, so users' SQL sees the same columns as before.

An id is the first 8 bytes of the text's BLAKE2b digest: equal content gets one row whichever request or decoder
brought it, and finding a second text for a given id takes about 2**64 tries, so one client cannot attach its
resource to another's spans.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # decode workers import the ids, not DuckDB
    import duckdb
    import pyarrow as pa

@dataclass(frozen=True)
class SpanRows:
    """A request's rows (receivers/span_rows.py builds them): its spans, and the resources and scopes they refer
    to, each once."""

    spans: pa.Table
    resources: pa.Table
    scopes: pa.Table

    @property
    def num_rows(self) -> int:
        return self.spans.num_rows

    @property
    def nbytes(self) -> int:
        """The Arrow bytes the request holds (its resources and scopes can be larger than its spans)."""
        return self.spans.nbytes + self.resources.nbytes + self.scopes.nbytes


# What the store's writer keeps in memory of the ids already stored, so a commit inserts only new ones.
MAX_KNOWN_IDS = 65_536


def resource_id(attributes_json: bytes) -> int:
    """The id of a resource, from its attributes' JSON text (UTF-8) as the row stores it."""
    return int.from_bytes(hashlib.blake2b(attributes_json, digest_size=8).digest(), "little", signed=True)


def scope_id(name: bytes, version: bytes) -> int:
    """The id of a scope, from its name and version (UTF-8; 0xFF, never in UTF-8, keeps the two apart)."""
    return int.from_bytes(hashlib.blake2b(name + b"\xff" + version, digest_size=8).digest(), "little", signed=True)


# Dictionary rows no span refers to any more (retention pruned their spans). Run by the span writer between
# commits (`SpanStore.run_in_writer`): a commit that found a row present and did not insert it again can then never
# meet its deletion.
PRUNE_UNREFERENCED = """
DELETE FROM span_resources WHERE resource_id NOT IN (SELECT DISTINCT resource_id FROM span_records);
DELETE FROM span_scopes WHERE scope_id NOT IN (SELECT DISTINCT scope_id FROM span_records);
"""


def prune_unreferenced(con: duckdb.DuckDBPyConnection) -> None:
    """Delete the resources and scopes no stored span refers to, in one transaction."""
    from tracejudge.collector.store.connection.transaction import (
        in_transaction,  # DuckDB only where the store runs, not in decode workers
    )

    in_transaction(con, lambda: con.execute(PRUNE_UNREFERENCED))
