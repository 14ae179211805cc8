"""The tracejudge process: CLI now; OTLP receivers, span store and pipeline wiring to come."""
