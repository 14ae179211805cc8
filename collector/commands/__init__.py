"""One module per `tracejudge` command, each imported only when its command runs, so `--help` and a query
against a running collector start fast."""

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
