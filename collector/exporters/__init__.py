"""What the collector sends on: scores as OTLP evaluation events to the user's observability backend."""
