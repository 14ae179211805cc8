"""From stored spans to scoring jobs: completing conversations, rebuilding them with `mapping`, and sampling."""
