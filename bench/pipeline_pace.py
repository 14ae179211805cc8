"""Does the pipeline keep pace with ingest? The same traffic sent twice to a fresh collector: once with a quiet
period of an hour (nothing completes: ingest alone), once with 2 s (conversations complete while spans arrive:
assembly, the deterministic checks, versions, jobs and summary tables run too). Pace = ingest alone's wall time /
the whole pipeline's (until the last conversation's call validity score is written); issue 41's goal is >= 0.6.

Traffic: bench/ingest.py's agent spans, 8 spans per trace and 64 per conversation (`gen_ai.conversation.id`), 512
per export, 8 exports in flight; the judged metrics have no judge (their jobs wait), call validity scores every
conversation. Prints both wall times, the pace, CPU seconds per process (server, decode workers, query children) and
per conversation, assembly's CPU per conversation by stage (`tracejudge_assembly_cpu_seconds_total`: plan, read,
build, write, observe: the budget issue 41 asks for), peak RSS (each process's own peak, summed: what the issue
bounds) and peak PSS (sampled; shared libraries counted once), export latency percentiles (and, paced, how many
exports took over 50 and 100 ms: the tail counted, steadier than its p99), and the spans assembly read back with the
time its reads took (`tracejudge_assembly_read_*`). A third run paces the same exports at half of ingest
alone's rate (the issue's half load: its p99 is the latency bound; a paced export's latency counts from when it was
due, so exports held back behind a stalled one count their wait) and prints how far the last score lags behind the
last export; `--rates` runs the whole pipeline at chosen rates in place of that half-load run, to find the rate it
keeps up with.

    python bench/pipeline_pace.py [--requests 750]     # 384k spans, 6,000 conversations (the issue's traffic)
    python bench/pipeline_pace.py --timeline           # and the whole pipeline run second by second
    python bench/pipeline_pace.py --tail               # and the half-load run's exports half a second at a time
    python bench/pipeline_pace.py --rates 10000,20000  # the whole pipeline paced at 10k, then 20k spans/s
    python bench/pipeline_pace.py --rates 10000 --checkpoint-threshold 4GB --assembling-checkpoint-threshold none
                                                       # no checkpoint within the run
    python bench/pipeline_pace.py --rates 50000 --paced-only --repeat 8
                                                       # only the paced runs, eight of them: the tail's spread
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import grpc
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import (  # noqa: E402
    EXPORT,
    build_requests,
    export_retrying,
    peak_rss_mb,
    percentile,
    process_tree,
    run,
    status_mb,
)
from tests.support.collector_process import CollectorProcess  # noqa: E402
from tracejudge.collector.pipeline.assembly.conversation_assembler import CPU_STAGES  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
QUIET_S = 2.0  # the whole pipeline's quiet period
STALL_S = 120.0  # no new score for this long: the wait for the last one ends early, with the collector's errors
PY_SPY = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}") \
    or "py-spy"


def cpu_seconds(pid: int) -> dict[int, float]:
    """utime + stime of the process and each of its children (their own threads included)."""
    out = {}
    for proc in process_tree(pid):
        try:
            fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[proc] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def _role(pid: int) -> str:
    """A process of the collector's tree, named for the bench's report: the server, or a child by pid."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return str(pid)
    if "tracejudge.collector.cli" in command:
        return "server"
    return f"{'resource_tracker' if 'resource_tracker' in command else 'worker'}-{pid}"


def scored(url: str) -> int:
    """Call validity scores written so far, from /metrics (a query through /api/query would copy the tables into
    its sandbox every poll and cost the server the CPU this bench measures)."""
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("tracejudge_score_count{") and 'metric="mcp_call_validity"' in line))


def last_score_at(db: Path) -> float:
    """When the collector wrote its last call validity score (epoch seconds), from its stopped database file."""
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT epoch_us(max(scored_at)) FROM scores WHERE metric = 'mcp_call_validity'"
                           ).fetchone()[0] / 1e6


TAIL_WINDOW_S = 0.5  # `--tail`: the paced exports in windows of this long, by when they were due


def print_tail(latencies: list[float], per_window: int, window_s: float) -> None:
    """The paced exports, in the order they were due, `per_window` at a time (`window_s` of the schedule)."""
    print("  due (s)  slowest ms  median ms  over 100 ms")
    for start in range(0, len(latencies), per_window):
        window = sorted(latencies[start:start + per_window])
        slowest, median = window[-1] * 1000, window[len(window) // 2] * 1000
        print(f"  {start // per_window * window_s:7.1f}  {slowest:10.1f}  {median:9.1f}  "
              f"{sum(1 for v in window if v > 0.1):11d}")


def pss_mb(pids: list[int]) -> float:
    """Proportional set size of these processes together: each shared page counted once across them (summed RSS
    counts the libraries every worker maps, about 40 MB each, once per worker)."""
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:")), 0)
    return total / 1024


class Timeline:
    """Every 0.25 s of a run: how idle the machine's cores were since the last sample, the server's and its
    children's RSS, and their PSS together (the kernel keeps each process's own RSS peak, VmHWM, but no peak of a
    sum); with the scores counted as the bench polls them, printed a line a second (`--timeline`)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.started = pid, time.perf_counter()
        self.samples: list[tuple[float, float, float, float]] = []  # (t, idle share, server MB, children MB)
        self.scored: list[tuple[float, int]] = []
        self.peak_pss = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _cpu() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    def _sample(self) -> None:
        idle, total = self._cpu()
        while not self._stop.wait(0.25):
            now_idle, now_total = self._cpu()
            share = (now_idle - idle) / max(1, now_total - total)
            idle, total = now_idle, now_total
            try:
                procs = process_tree(self.pid)
                server, children = status_mb(self.pid, "VmRSS"), sum(status_mb(p, "VmRSS") for p in procs[1:])
            except OSError:
                continue
            self.peak_pss = max(self.peak_pss, pss_mb(procs))
            self.samples.append((time.perf_counter() - self.started, share, server, children))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def print(self) -> None:
        print("  t (s)  cores idle  server MB  children MB  scored")
        for second in range(int(self.samples[-1][0]) + 1 if self.samples else 0):
            window = [s for s in self.samples if second <= s[0] < second + 1]
            if window:
                scored = max((n for t, n in self.scored if t < second + 1), default=0)
                print(f"  {second:5d}  {sum(s[1] for s in window) / len(window):9.0%}  "
                      f"{max(s[2] for s in window):9.0f}  {max(s[3] for s in window):11.0f}  {scored:6d}")


def one_run(quiet: str, requests: list[bytes], args: argparse.Namespace, conversations: int,
            rate: float | None = None) -> dict[str, object]:
    """One fresh collector sent the traffic, at full speed or paced at `rate` spans/s, until the last score."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tracejudge.toml"
        assembly = "" if args.assembly_workers is None else f"assembly_workers = {args.assembly_workers}\n"
        if args.share_under_load is not None:
            assembly += f"share_under_load = {args.share_under_load}\n"
        store = "".join(f"{name} = \"{value}\"\n" for name, value in (
            ("checkpoint_threshold", args.checkpoint_threshold),
            ("assembling_checkpoint_threshold", args.assembling_checkpoint_threshold),
            ("memory_limit", args.memory_limit),
            ("journal_after", args.journal_after))
            if value is not None)
        store = f"[store]\n{store}" if store else ""
        if args.request_row_bytes is not None:
            store += f"[limits]\nrequest_row_bytes = \"{args.request_row_bytes}\"\n"
        config.write_text(f"[conversations]\nquiet_period_s = \"{quiet}\"\n{assembly}{store}")
        collector = CollectorProcess(Path(tmp) / "pace.duckdb", config=config).start()
        try:
            pid = collector.proc.pid  # type: ignore[union-attr]
            before = sum(cpu_seconds(pid).values())
            spy = subprocess.Popen([PY_SPY, "record", "-p", str(pid), "-o", args.profile, "-f", "raw", "-r", "50",
                                    "--subprocesses", "--nonblocking"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL) \
                if args.profile and quiet != "1h" and rate is None else None
            channel = grpc.insecure_channel(collector.grpc_endpoint,
                                            options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            timeline = Timeline(pid)
            started, started_wall = time.perf_counter(), time.time()
            wall, latencies = run(lambda body: export_retrying(export, body), requests, args.in_flight, rate,
                                  args.spans)
            done_at, last = None, 0
            if quiet != "1h":
                deadline = time.perf_counter() + args.timeout
                progress_at = time.perf_counter()
                while time.perf_counter() < deadline and time.perf_counter() - progress_at < STALL_S:
                    if collector.proc.poll() is not None:  # type: ignore[union-attr]
                        sys.exit(f"the collector exited (status {collector.proc.returncode}) before the last "  # type: ignore[union-attr]
                                 f"score: {collector_errors(collector.log_lines)}")
                    now_scored = scored(collector.admin_url)
                    if now_scored > last:
                        progress_at = time.perf_counter()
                    last = now_scored
                    timeline.scored.append((time.perf_counter() - timeline.started, last))
                    if last >= conversations:
                        done_at = time.perf_counter() - started
                        break
                    time.sleep(0.5)
            timeline.stop()
            read_s = collector.metric("tracejudge_assembly_read_seconds_total")
            stages = {stage: collector.metric(f'tracejudge_assembly_cpu_seconds_total{{stage="{stage}"}}')
                      for stage in CPU_STAGES}
            read_spans = collector.metric("tracejudge_assembly_read_spans_total")
            if args.timeline and quiet != "1h" and rate is None:
                timeline.print()
            if args.tail and rate is not None:
                print_tail(latencies, max(1, round(TAIL_WINDOW_S * rate / args.spans)), TAIL_WINDOW_S)
            cpu = cpu_seconds(pid)
            rss = peak_rss_mb(pid)
            rss_each = {_role(proc): round(status_mb(proc, "VmHWM")) for proc in process_tree(pid)}
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
            channel.close()
        finally:
            collector.stop()
        if done_at is not None:  # when the last score was written, not when a poll of /metrics saw it (0.5 s apart)
            done_at = last_score_at(Path(tmp) / "pace.duckdb") - started_wall
    return {"ingest_wall_s": round(wall, 2), "pipeline_wall_s": round(done_at, 2) if done_at else None,
            "scored": last, "cpu_s_server": round(cpu.get(pid, 0.0), 1),
            "cpu_s_children": round(sum(v for p, v in cpu.items() if p != pid), 1),
            "cpu_s_total": round(sum(cpu.values()) - before, 1), "peak_rss_mb": round(rss),
            "peak_pss_mb": round(timeline.peak_pss),
            "peak_rss_each_mb": rss_each, "read_back_s": round(read_s, 2), "read_back_spans": int(read_spans),
            "assembly_cpu_s": {stage: round(seconds, 2) for stage, seconds in stages.items()},
            "p50_ms": round(percentile(latencies, 50) * 1000, 1), "p99_ms": round(percentile(latencies, 99) * 1000, 1),
            # the tail counted, steadier from run to run than its 99th percentile (a handful of exports either way)
            "over_50_ms": sum(1 for v in latencies if v > 0.05), "over_100_ms": sum(1 for v in latencies if v > 0.1),
            "errors": [] if done_at or quiet == "1h" else collector_errors(collector.log_lines),
            "problems": collector_problems(collector.log_lines)}


def log_records(log_lines: list[str], levels: tuple[str, ...]) -> Iterator[dict[str, object]]:
    """The collector's JSON log records at these levels (other lines, a traceback say, left out)."""
    for line in log_lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("level") in levels:
            yield record


def collector_problems(log_lines: list[str]) -> dict[str, int]:
    """How many times the collector logged each warning and error (by level and event) in a run: a run that
    finished late with no error at the end (a stall it recovered from) shows what it waited on."""
    found: dict[str, int] = {}
    for record in log_records(log_lines, ("warning", "error", "critical")):
        key = f"{record['level']}: {record.get('event')}"
        found[key] = found.get(key, 0) + 1
    return found


def collector_errors(log_lines: list[str], most: int = 3) -> list[str]:
    """The collector's last distinct errors (event and reason), for a run whose scores stopped coming."""
    found: dict[str, None] = {}
    for record in log_records(log_lines, ("error", "critical")):
        reason = record.get("error") or record.get("reason") or ""
        found.pop(text := f"{record.get('event')}: {reason}"[:500], None)
        found[text] = None
    return list(found)[-most:]


def ingest_alone_and_whole_pipeline(requests: list[bytes], args: argparse.Namespace, conversations: int,
                                    spans: int) -> dict[str, dict[str, Any]]:
    """The first two runs: the traffic with nothing completing, then with the 2 s quiet period (the pace)."""
    alone = one_run("1h", requests, args, conversations)
    print(f"ingest alone (quiet period 1h): {alone['ingest_wall_s']} s, {spans / alone['ingest_wall_s']:,.0f} "
          f"spans/s; CPU {alone['cpu_s_total']} s; peak RSS {alone['peak_rss_mb']} MB (PSS {alone['peak_pss_mb']} "
          f"MB); export p99 {alone['p99_ms']} ms")
    report = {"ingest_alone": alone}
    whole = report["whole_pipeline"] = one_run(f"{QUIET_S:.0f}s", requests, args, conversations)
    if whole["pipeline_wall_s"] is None:
        print(f"whole pipeline (quiet period 2s): {whole['scored']} of {conversations} scored (the wait ends after "
              f"{args.timeout:.0f} s, or {STALL_S:.0f} s without a new score); the collector's last errors: "
              f"{whole['errors'] or 'none'}")
    else:
        pipeline = whole["pipeline_wall_s"]
        pace = alone["ingest_wall_s"] / pipeline
        extra_cpu = whole["cpu_s_total"] - alone["cpu_s_total"]
        print(f"whole pipeline (quiet period 2s): ingest {whole['ingest_wall_s']} s, last conversation scored after "
              f"{pipeline} s: {conversations / pipeline:,.0f} conversations/s, {spans / pipeline:,.0f} spans/s")
        pace_without_quiet = alone["ingest_wall_s"] / max(pipeline - QUIET_S, 1e-9)
        print(f"pace {pace:.2f} (goal >= 0.6; {pace_without_quiet:.2f} without the {QUIET_S:.0f} s the collector "
              f"waits for the last conversation to go quiet); CPU {whole['cpu_s_total']} s "
              f"(server {whole['cpu_s_server']}, "
              f"children {whole['cpu_s_children']}): {extra_cpu * 1000 / conversations:.2f} ms of CPU per "
              f"conversation beyond ingest; peak RSS {whole['peak_rss_mb']} MB (PSS {whole['peak_pss_mb']} MB); "
              f"export p99 {whole['p99_ms']} ms; spans read back for assembly: {whole['read_back_spans']:,} in "
              f"{whole['read_back_s']} s")
        budget = ", ".join(f"{stage} {seconds * 1000 / conversations:.2f}"
                           for stage, seconds in whole["assembly_cpu_s"].items())
        print(f"assembly's CPU per conversation, by stage (ms): {budget} (build: the workers' and the server's; "
              f"observe runs during ingest alone too)")
        whole["pace"] = round(pace, 3)
        whole["pace_without_quiet_period"] = round(pace_without_quiet, 3)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=750, help="exports (default 750: 384k spans)")
    parser.add_argument("--spans", type=int, default=512, help="spans per export (a multiple of 64)")
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--assembly-workers", type=int, help="[conversations] assembly_workers (default: the "
                        "collector's own, one per core)")
    parser.add_argument("--share-under-load", type=float, help="[conversations] share_under_load (default: the "
                        "collector's own): the share of its time the assembler keeps to while the span writer is busy "
                        "half the time or more")
    parser.add_argument("--checkpoint-threshold", metavar="SIZE", help="[store] checkpoint_threshold (default: the "
                        "collector's own): each checkpoint holds every commit, and so the exports in them, while it "
                        "runs; one larger than what a run writes shows the latency without them")
    parser.add_argument("--assembling-checkpoint-threshold", metavar="SIZE", help="[store] "
                        "assembling_checkpoint_threshold (default: the collector's own, 64MB): the assembler folds the "
                        "WAL at this size after its writes; none: only DuckDB's checkpoints, at checkpoint_threshold")
    parser.add_argument("--journal-after", metavar="DURATION", help="[store] journal_after (default: the "
                        "collector's own, 50ms): a commit held this long has the exports waiting on it journaled and "
                        "acknowledged; none: they wait for their commit, as before the journal")
    parser.add_argument("--memory-limit", metavar="SIZE", help="[store] memory_limit (default: the collector's own): "
                        "DuckDB's buffer pool, full in both runs; the collector refuses less than 96MB")
    parser.add_argument("--request-row-bytes", metavar="SIZE", help="[limits] request_row_bytes (default: the "
                        "collector's own, 48MiB)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the last score (the wait "
                        f"also ends after {STALL_S:.0f} s without a new one, printing the collector's last errors)")
    parser.add_argument("--profile", metavar="FILE", help="record the whole pipeline run's server and its "
                        "worker processes with py-spy (collapsed stacks, for the CPU budget; py-spy beside the "
                        "interpreter or on the PATH)")
    parser.add_argument("--rates", type=lambda text: [float(v) for v in text.split(",")], metavar="SPANS_S,...",
                        help="pace the whole pipeline's exports at these span rates, one run each (default: half "
                        "of ingest alone's rate, the issue's half load): the export latency while conversations "
                        "complete, and how far the last score lags behind the last export")
    parser.add_argument("--timeline", action="store_true", help="print the whole pipeline run second by second: "
                        "how idle the cores were, the server's and its children's RSS, the scores so far")
    parser.add_argument("--tail", action="store_true", help="print each paced run's exports half a second at a time, "
                        "by when they were due: the slowest, the median and how many took over 100 ms (whether the "
                        "tail comes in bursts, and when)")
    parser.add_argument("--paced-only", action="store_true", help="with --rates: only the paced runs, not ingest alone "
                        "nor the whole pipeline at full speed (tail comparisons, with --repeat)")
    parser.add_argument("--repeat", type=int, default=1, help="run each paced rate this many times, each on a fresh "
                        "collector (a burst past 100 ms comes in about one half-load run in eight)")
    args = parser.parse_args()
    if args.paced_only and args.rates is None:
        parser.error("--paced-only needs --rates: the half load is half of ingest alone's rate, measured in its run")
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    requests = build_requests(args.requests, args.spans)
    spans = args.requests * args.spans
    conversations = spans // 64
    print(f"traffic: {spans:,} spans, {conversations:,} conversations of 64 spans, {args.spans} per export, "
          f"{args.in_flight} in flight")
    report: dict[str, dict[str, Any]] = {}
    if not args.paced_only:
        report.update(ingest_alone_and_whole_pipeline(requests, args, conversations, spans))
    rates = [spans / report["ingest_alone"]["ingest_wall_s"] / 2] if args.rates is None else args.rates
    for rate, run_number in ((r, n) for r in rates for n in range(args.repeat)):
        name = f"paced_{rate:.0f}" + (f"_{run_number + 1}" if args.repeat > 1 else "")
        paced = report[name] = one_run(f"{QUIET_S:.0f}s", requests, args, conversations, rate)
        done = paced["pipeline_wall_s"]
        behind = f"{done - paced['ingest_wall_s'] - QUIET_S:.2f} s behind" if done else \
            f"{paced['scored']} of {conversations} scored (errors: {paced['errors'] or 'none'}),"
        half = " (half of ingest alone's rate)" if args.rates is None else ""
        print(f"whole pipeline paced at {rate:,.0f} spans/s{half}: sent in {paced['ingest_wall_s']} s, last score "
              f"after {done} s, {behind} the last export and its quiet period; export p50 / p99 "
              f"{paced['p50_ms']} / {paced['p99_ms']} ms, {paced['over_50_ms']} / {paced['over_100_ms']} of "
              f"{len(requests)} over 50 / 100 ms; peak RSS {paced['peak_rss_mb']} MB (PSS {paced['peak_pss_mb']} MB)")
    if args.repeat > 1:
        for rate in rates:
            runs = [report[f"paced_{rate:.0f}_{n + 1}"] for n in range(args.repeat)]
            over = sum(r["over_100_ms"] for r in runs)
            p99s = sorted(r["p99_ms"] for r in runs)
            bursts = sum(r["over_100_ms"] > len(requests) / 100 for r in runs)  # the p99 itself past 100 ms
            print(f"{rate:,.0f} spans/s over {len(runs)} runs: export p99 {p99s[0]}-{p99s[-1]} ms (median "
                  f"{p99s[len(p99s) // 2]}), {over} of {len(runs) * len(requests)} exports over 100 ms; runs with "
                  f"over 1 % of their exports past 100 ms: {bursts}")
    for name, outcome in report.items():
        if outcome["problems"]:
            print(f"the collector's warnings and errors, {name.replace('_', ' ')}: {outcome['problems']}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
