"""How the collector talks to DuckDB: Arrow in (registered id tables) and out (`arrow_reads`), transactions, the
checkpoint gate every writing cursor goes through, and giving freed memory back."""
