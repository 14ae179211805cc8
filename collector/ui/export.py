"""`tracejudge report` and the admin API's `/report`: the web UI's views exported into one self-contained file.

The overview, the failing conversations, the MCP tools and the worst conversations in full, rendered with the
UI's own templates in static mode: no script, nothing loaded from elsewhere, links that stay inside the page.
Over a read-only history (a replica's file, several replicas, the lake) the summary tables the views read are
built as temporary tables first.
"""

from __future__ import annotations

import datetime as dt

import duckdb

from tracejudge.collector import durations
from tracejudge.collector.durations import DurationError
from tracejudge.collector.pipeline.summary_tables import SummaryTables
from tracejudge.collector.store.schema import summary_tables_ddl
from tracejudge.collector.ui import views
from tracejudge.collector.ui.charts import trend_chart
from tracejudge.collector.ui.rendering import environment
from tracejudge.errors import TracejudgeError

MAX_REPORT_DAYS = 731  # a report covers two years at most, whichever way --since is written
IN_FULL = 25  # conversations shown turn by turn; the list above names the rest


class ReportError(TracejudgeError):
    """The report cannot be built: a bad --since or a database without tracejudge's tables."""


def parse_since(text: str, today: dt.date) -> dt.date:
    """`7d`, `12h`, `2w` (back from today, UTC) or a date like 2026-11-25."""
    try:
        return durations.parse_since(text, today, MAX_REPORT_DAYS)
    except DurationError as exc:
        raise ReportError(str(exc)) from None


def export_views(con: duckdb.DuckDBPyConnection, since: str, source: str, *, summaries: SummaryTables | None = None,
                 budget_usd: float | None = None, trace_url: str | None = None) -> str:
    """The page for the UTC days from `since` to now. `summaries`: the live database's summary tables (refreshed
    first); without them they are built as temporary tables over `con`."""
    now = dt.datetime.now(dt.UTC)
    start_day = parse_since(since, now.date())
    start = dt.datetime.combine(start_day, dt.time(), dt.UTC)
    window = f"{int((now - start).total_seconds())}s"
    stale = None
    try:
        if summaries is None:
            con.execute(summary_tables_ddl(temporary=True))
        try:
            (summaries or SummaryTables()).refresh(con)
        except duckdb.CatalogException:
            raise
        except duckdb.Error as exc:  # the report degrades: what was summarised before, said to be stale
            stale = (f"The summaries could not be brought up to date ({type(exc).__name__}): the lists below may "
                     "miss the newest conversations.")
        overview = views.overview(con, window, "", budget_usd)
        failing = views.conversations(con, views.ConversationFilter(window=window, result="fail"))
        latest = views.conversations(con, views.ConversationFilter(window=window))
        tools = views.tools(con, window)
        ids = list(dict.fromkeys(r["conversation_id"] for r in failing.rows + latest.rows))[:IN_FULL]
        details = [d for d in (views.conversation(con, i, None, trace_url) for i in ids) if d is not None]
        columns = [c for c, *_ in con.execute("DESCRIBE scores").fetchall()]
        replicas = [r for (r,) in con.execute("SELECT DISTINCT replica FROM scores ORDER BY 1").fetchall()] \
            if "replica" in columns else []
    except duckdb.CatalogException as exc:
        raise ReportError(f"{source} has no tracejudge history ({str(exc).splitlines()[0]}): is this a tracejudge "
                          "database? Point --db at a collector's file, or --url at a running collector") from exc
    charts = [(t, trend_chart(t.points, start, now)) for t in overview.trends]
    return environment(static=True).get_template("export.html").render(
        nonce="", live=False, signed_in=False, stale=stale, page="overview", generated=now,
        since=start_day.isoformat(),
        source=source, replicas=replicas, overview=overview, charts=charts, failing=failing, tools=tools,
        details=details, window=window, window_label=f"since {start_day.isoformat()} (UTC)")
