"""`tracejudge test run`: DeepEval's `deepeval test run`, a pytest run of `assert_test` tests, in parallel workers
with `-n` (pytest-xdist) and recorded into a tracejudge database with `--db`."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from tracejudge.collector.commands import EXIT_BAD_INPUT


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pytest") is None:
        print("tracejudge test run: runs your assert_test tests with pytest, which is not installed: "
              "pip install pytest (or pip install 'tracejudge[test]')", file=sys.stderr)
        return EXIT_BAD_INPUT
    import pytest

    argv = list(args.pytest_args)
    if args.workers is not None:
        if importlib.util.find_spec("xdist") is None:
            print("tracejudge test run: -n runs tests in parallel with pytest-xdist, which is not installed: "
                  "pip install pytest-xdist (or leave out -n)", file=sys.stderr)
            return EXIT_BAD_INPUT
        argv += ["-n", args.workers]
    if args.db:
        argv += ["--tracejudge-db", args.db]
    return int(pytest.main(argv))  # pytest's exit status: 0 passed, 1 a test failed, 2-5 see pytest's docs
