"""The web UI the collector serves on its admin port: overview, conversations, one conversation, MCP tools."""
