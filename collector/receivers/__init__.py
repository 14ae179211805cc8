"""OTLP in: the gRPC and HTTP receivers, what both do with a request (authenticate, decode, store, answer), and
the decode workers that turn requests into Arrow rows of the spans table."""
