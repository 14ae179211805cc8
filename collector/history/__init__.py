"""Score history out: read-only SQL, the HTML report, Parquet export paths, several replicas' files and the
shared DuckLake."""
