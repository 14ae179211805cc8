"""`tracejudge set-eval-mode`: write the default eval mode to the config file."""

from __future__ import annotations

import argparse
import os
import sys

import httpx

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_PASS
from tracejudge.collector.config_file import ConfigFileError, set_value
from tracejudge.eval_mode import config_path


def run(args: argparse.Namespace) -> int:
    path = config_path()
    try:
        set_value(path, "scoring", "eval_mode", args.mode)
    except ConfigFileError as exc:
        print(f"tracejudge set-eval-mode: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"eval_mode = {args.mode!r} written to [scoring] in {path.resolve()}")
    if os.environ.get("TRACEJUDGE_EVAL_MODE"):
        print(f"note: TRACEJUDGE_EVAL_MODE={os.environ['TRACEJUDGE_EVAL_MODE']} is set and takes precedence "
              "over the config file", file=sys.stderr)
    if _collector_running(args.url):
        print(f"note: a collector is running at {args.url}; it reads the config file at start, so restart it "
              "(stop it with Ctrl-C or SIGTERM, then `tracejudge serve` again) to score new conversations in "
              f"{args.mode} mode", file=sys.stderr)
    return EXIT_PASS


def _collector_running(url: str) -> bool:
    try:
        return httpx.get(f"{url.rstrip('/')}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
