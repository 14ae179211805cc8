"""OTLP spans to conversations to test cases (pure, no I/O). Not built yet: see the mapping issue."""
