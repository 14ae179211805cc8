"""The metric ids, without the metrics: settings and the command line validate names without loading judges."""

JUDGED_METRIC_IDS = ("mcp_use", "mcp_task_completion")
METRIC_IDS = (*JUDGED_METRIC_IDS, "mcp_call_validity")
