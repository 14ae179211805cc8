"""`tracejudge simulate`: goldens (a file, or last week's failing production conversations) driven through an agent
by a scripted or simulated user, scored with the configured metrics, and stored as a cohort in a history file, so
`tracejudge compare` and the canary gate read them next to production or a baseline run."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import sys
import uuid
from pathlib import Path
from typing import Any

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.durations import DurationError, parse_duration

COHORT_KEY = "tracejudge.cohort"


def _agent(spec: str) -> Any:
    """`module:callable`, imported with the current directory on the path."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"--agent takes module:callable (e.g. my_agent:reply), not {spec!r}")
    sys.path.insert(0, str(Path.cwd()))
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load the agent {spec!r}: {exc}") from exc
    if not callable(found):
        raise ValueError(f"the agent {spec!r} is not callable")
    return found


def _metric(name: str, sc: Any) -> Any:
    """A metric by its id, with [scoring]'s threshold and judge (as the collector builds it)."""
    from tracejudge import METRICS

    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRICS)}")
    if name == "mcp_call_validity":
        return METRICS[name](threshold=sc.threshold, strict_mode=sc.strict_mode)
    return METRICS[name](threshold=sc.threshold, strict_mode=sc.strict_mode, model=sc.model, eval_mode=sc.eval_mode,
                         system_one_model=sc.system_one_model)


def _goldens(args: argparse.Namespace) -> list[Any]:
    from tracejudge.dataset import EvaluationDataset

    if args.goldens:
        dataset = EvaluationDataset()
        path = Path(args.goldens)
        (dataset.add_goldens_from_csv_file if path.suffix == ".csv" else dataset.add_goldens_from_json_file)(path)
        return dataset.goldens
    since = dt.timedelta(seconds=parse_duration(args.from_history))
    return EvaluationDataset.from_history(args.history_db, since=since, failing_only=not args.all).goldens


def run(args: argparse.Namespace) -> int:
    from tracejudge.collector.commands.compare import gate_answer, parse_gate
    from tracejudge.collector.config import ConfigError, load_settings
    from tracejudge.collector.store.results_file import ScoredCase, write_results
    from tracejudge.dataset import DatasetError
    from tracejudge.simulator import ConversationSimulator, SimulationError

    if bool(args.goldens) == bool(args.from_history):
        print("tracejudge simulate: give the goldens: --goldens FILE, or --from-history 7d (with --history-db)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        settings = load_settings(Path(args.config) if args.config else None)
        agent = _agent(args.agent)
        goldens = _goldens(args)
        names = args.metric or list(settings.scoring.metrics)
        metrics = [_metric(n, settings.scoring) for n in names]
        gate = parse_gate(args.fail_if_worse) if args.fail_if_worse else None  # before the run, not after it
    except (ValueError, ConfigError, DatasetError, DurationError, OSError) as exc:
        print(f"tracejudge simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not goldens:
        print("tracejudge simulate: no goldens to simulate (nothing failed in that window?)", file=sys.stderr)
        return EXIT_BAD_INPUT
    simulator = ConversationSimulator(model_callback=agent, simulator_model=args.simulator_model,
                                      max_concurrent=args.concurrency, scripted_users=True if args.scripted else None,
                                      show_progress=True)
    try:
        if args.traced:
            from tracejudge.collector.simulation import TracedConversations, TracingError

            try:
                with TracedConversations() as traced:
                    cases = traced.test_cases(simulator.simulate(goldens, max_user_simulations=args.max_turns))
            except TracingError as exc:
                print(f"tracejudge simulate: {exc}", file=sys.stderr)
                return EXIT_BAD_INPUT
        else:
            cases = simulator.simulate(goldens, max_user_simulations=args.max_turns)
    except SimulationError as exc:
        print(f"tracejudge simulate: {exc}", file=sys.stderr)
        return EXIT_FAIL
    from tracejudge.evaluation import evaluate

    results = evaluate(cases, metrics, print_results=False).test_results
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
    scored = [ScoredCase(f"sim:{args.cohort}:{run_id}:{i}", case.name, case, result,
                         {COHORT_KEY: [args.cohort], "tracejudge.simulation.run": [run_id]})
              for i, (case, result) in enumerate(zip(cases, results, strict=True))]
    write_results(Path(args.out), scored, "simulation", f"simulation:{args.cohort}")
    passed = sum(r.passed for r in results)
    cost = simulator.simulation_cost
    print(f"simulated {len(cases)} conversations as cohort {COHORT_KEY}={args.cohort} in {args.out}: {passed} "
          f"passed every metric; simulated user cost "
          f"{'unknown' if cost is None else f'${cost:.4f}'} (the judge's is in the scores)")
    if gate is not None:
        from tracejudge.collector.history.compare import CohortError, canary, parse_cohort
        from tracejudge.collector.history.history_sources import open_history

        con, _ = open_history(False, [args.out, *(args.baseline_db or [])], None)
        try:
            result = canary(con, parse_cohort(args.baseline), parse_cohort(f"{COHORT_KEY}={args.cohort}"), *gate,
                            1 - args.confidence)
        except CohortError as exc:
            print(f"tracejudge simulate: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        finally:
            con.close()
        return gate_answer(result, "table")
    return EXIT_PASS
