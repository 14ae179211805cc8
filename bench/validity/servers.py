"""The MCP servers of the validity corpus, with tool schemas written like the real servers' (the reference
filesystem and SQLite servers, GitHub's, a Google Calendar server, Brave Search), and the tasks an agent does
with them. A task is a request, the calls that serve it (arguments and results) and an answer built from the
results, so a fault seeded into any of them is known by construction."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"name": name, "description": description,
            "inputSchema": {"type": "object", "properties": properties, "required": required,
                            "additionalProperties": False}}


S = {"type": "string"}
INT = {"type": "integer"}

SERVERS: dict[str, dict[str, Any]] = {
    "filesystem": {"server_name": "filesystem", "available_tools": [
        tool("read_text_file", "Read the complete contents of a file as text. Use head or tail to read only the "
             "first or last N lines.", {"path": S, "head": {**INT, "minimum": 1}, "tail": {**INT, "minimum": 1}},
             ["path"]),
        tool("write_file", "Create a new file or completely overwrite an existing file with new content.",
             {"path": S, "content": S}, ["path", "content"]),
        tool("list_directory", "Get a detailed listing of all files and directories in a specified path.",
             {"path": S}, ["path"]),
        tool("search_files", "Recursively search for files and directories matching a pattern.",
             {"path": S, "pattern": S, "excludePatterns": {"type": "array", "items": S}}, ["path", "pattern"]),
        tool("get_file_info", "Retrieve detailed metadata about a file or directory: size, times, permissions.",
             {"path": S}, ["path"]),
        tool("move_file", "Move or rename files and directories.", {"source": S, "destination": S},
             ["source", "destination"]),
    ]},
    "database": {"server_name": "sqlite", "available_tools": [
        tool("list_tables", "List all tables in the SQLite database.", {}, []),
        tool("describe_table", "Get the schema information for a specific table.", {"table_name": S},
             ["table_name"]),
        tool("read_query", "Execute a SELECT query on the SQLite database.", {"query": S}, ["query"]),
        tool("write_query", "Execute an INSERT, UPDATE, or DELETE query on the SQLite database.", {"query": S},
             ["query"]),
        tool("create_table", "Create a new table in the SQLite database.", {"query": S}, ["query"]),
    ]},
    "issues": {"server_name": "github", "available_tools": [
        tool("search_issues", "Search for issues in GitHub repositories using issue search syntax.",
             {"query": S, "perPage": {**INT, "minimum": 1, "maximum": 100}}, ["query"]),
        tool("get_issue", "Get details of a specific issue in a GitHub repository.",
             {"owner": S, "repo": S, "issue_number": INT}, ["owner", "repo", "issue_number"]),
        tool("create_issue", "Create a new issue in a GitHub repository.",
             {"owner": S, "repo": S, "title": S, "body": S, "labels": {"type": "array", "items": S}},
             ["owner", "repo", "title"]),
        tool("add_issue_comment", "Add a comment to a specific issue in a GitHub repository.",
             {"owner": S, "repo": S, "issue_number": INT, "body": S}, ["owner", "repo", "issue_number", "body"]),
        tool("update_issue", "Update an existing issue in a GitHub repository.",
             {"owner": S, "repo": S, "issue_number": INT, "state": {"type": "string", "enum": ["open", "closed"]},
              "labels": {"type": "array", "items": S}}, ["owner", "repo", "issue_number"]),
        tool("list_pull_requests", "List pull requests in a GitHub repository.",
             {"owner": S, "repo": S, "state": {"type": "string", "enum": ["open", "closed", "all"]}},
             ["owner", "repo"]),
    ]},
    "calendar": {"server_name": "google-calendar", "available_tools": [
        tool("list_events", "List events from a calendar between two times.",
             {"calendarId": S, "timeMin": {"type": "string", "format": "date-time"},
              "timeMax": {"type": "string", "format": "date-time"}}, ["calendarId", "timeMin", "timeMax"]),
        tool("create_event", "Create a new calendar event.",
             {"calendarId": S, "summary": S, "start": {"type": "string", "format": "date-time"},
              "end": {"type": "string", "format": "date-time"},
              "attendees": {"type": "array", "items": {"type": "string", "format": "email"}}},
             ["calendarId", "summary", "start", "end"]),
        tool("delete_event", "Delete a calendar event.", {"calendarId": S, "eventId": S}, ["calendarId", "eventId"]),
        tool("find_free_slots", "Find free time slots of at least the given length on a date.",
             {"calendarId": S, "date": {"type": "string", "format": "date"},
              "durationMinutes": {**INT, "minimum": 5, "maximum": 480}}, ["calendarId", "date", "durationMinutes"]),
    ]},
    "search": {"server_name": "brave-search", "available_tools": [
        tool("brave_web_search", "Performs a web search using the Brave Search API, for general queries, news "
             "and articles.", {"query": S, "count": {**INT, "minimum": 1, "maximum": 20},
                               "offset": {**INT, "minimum": 0, "maximum": 9}}, ["query"]),
        tool("brave_local_search", "Searches for local businesses and places.",
             {"query": S, "count": {**INT, "minimum": 1, "maximum": 20}}, ["query"]),
        tool("fetch_url", "Fetch a URL and return its content as markdown.", {"url": {"type": "string",
                                                                                      "format": "uri"}}, ["url"]),
    ]},
}


@dataclass
class Call:
    name: str
    args: dict[str, Any]
    result: str
    is_error: bool = False


@dataclass
class Task:
    """One request and how a correct agent serves it. `facts` are (value in the answer, a plausible wrong value)
    pairs; `other_args` gives the same task aimed at a plausible wrong target: (args, result, answer)."""

    request: str
    calls: list[Call]
    answer: str
    facts: list[tuple[str, str]]
    other: Callable[[], tuple[dict[str, Any], str, str]]
    detour: Call | None = None  # a reasonable extra step: the same answer reached the long way
    labels: dict[str, str] = field(default_factory=dict)


PROJECTS = ["atlas", "borealis", "cinder", "dune", "ember", "fjord", "granite", "harbor"]
PEOPLE = ["alice@example.com", "bob@example.com", "chen@example.com", "dara@example.com", "eli@example.com"]
CITIES = ["Lisbon", "Oslo", "Kyoto", "Austin", "Nairobi", "Porto", "Quebec"]


def filesystem(rng: random.Random) -> Task:
    project, other = rng.sample(PROJECTS, 2)
    kind = rng.randrange(3)
    if kind == 0:
        lines = rng.randint(3, 9)

        def read(p: str) -> tuple[str, list[str]]:
            version = f"{rng.randint(1, 4)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
            return f"# {p}\nversion = \"{version}\"\nowner = \"{rng.choice(PEOPLE)}\"\n", [version]

        path = f"/srv/{project}/pyproject.toml"
        text, (version,) = read(project)

        def wrong() -> tuple[dict[str, Any], str, str]:
            t, (v,) = read(other)
            return {"path": f"/srv/{other}/pyproject.toml", "head": lines}, t, f"The {project} package is at version {v}."
        return Task(f"Which version is the {project} package at? Its pyproject.toml is in /srv/{project}.",
                    [Call("read_text_file", {"path": path, "head": lines}, text)],
                    f"The {project} package is at version {version}.", [(f"version {version}", f"version {int(version[0]) + 1}{version[1:]}")],
                    wrong, Call("list_directory", {"path": f"/srv/{project}"},
                                "[FILE] pyproject.toml\n[FILE] README.md\n[DIR] src"))
    if kind == 1:
        count = rng.randint(2, 6)
        names = [f"{rng.choice(['report', 'notes', 'draft', 'summary'])}-{i}.md" for i in range(count)]

        def wrong() -> tuple[dict[str, Any], str, str]:
            n = rng.randint(1, 3)
            return ({"path": f"/home/docs/{other}", "pattern": "*.md"},
                    "\n".join(f"/home/docs/{other}/old-{i}.md" for i in range(n)),
                    f"There are {n} Markdown files in {project}.")
        return Task(f"How many Markdown files are there under /home/docs/{project}?",
                    [Call("search_files", {"path": f"/home/docs/{project}", "pattern": "*.md"},
                          "\n".join(f"/home/docs/{project}/{n}" for n in names))],
                    f"There are {count} Markdown files under /home/docs/{project}: {', '.join(names)}.",
                    [(f"are {count} Markdown", f"are {count + 2} Markdown")], wrong)
    size = rng.randint(2, 900)

    def wrong() -> tuple[dict[str, Any], str, str]:
        s = rng.randint(2, 900)
        return {"path": f"/var/log/{other}.log"}, f"size: {s} KB\nmodified: 2026-11-30T08:00:00Z", \
            f"/var/log/{project}.log is {s} KB."
    return Task(f"How big is the log file /var/log/{project}.log?",
                [Call("get_file_info", {"path": f"/var/log/{project}.log"},
                      f"size: {size} KB\nmodified: 2026-12-01T09:12:00Z\npermissions: rw-r--r--")],
                f"/var/log/{project}.log is {size} KB, last modified on 2026-12-01.", [(f"is {size} KB", f"is {size * 3} KB")],
                wrong)


def database(rng: random.Random) -> Task:
    table, other = rng.sample(["orders", "customers", "invoices", "shipments", "refunds"], 2)
    kind = rng.randrange(2)
    if kind == 0:
        n = rng.randint(10, 5000)

        def wrong() -> tuple[dict[str, Any], str, str]:
            m = rng.randint(10, 5000)
            return {"query": f"SELECT count(*) FROM {other}"}, f"[{{\"count(*)\": {m}}}]", \
                f"The {table} table has {m} rows."
        return Task(f"How many rows does the {table} table have?",
                    [Call("read_query", {"query": f"SELECT count(*) FROM {table}"}, f"[{{\"count(*)\": {n}}}]")],
                    f"The {table} table has {n} rows.", [(f"has {n} rows", f"has {n * 2 + 7} rows")], wrong,
                    Call("list_tables", {}, "[" + ", ".join(f'"{t}"' for t in (table, other, "users")) + "]"))
    city = rng.choice(CITIES)
    total = round(rng.uniform(100, 9000), 2)

    def wrong() -> tuple[dict[str, Any], str, str]:
        other_city = rng.choice([c for c in CITIES if c != city])
        t = round(rng.uniform(100, 9000), 2)
        return ({"query": f"SELECT sum(amount) FROM {table} WHERE city = '{other_city}'"},
                f"[{{\"sum(amount)\": {t}}}]", f"The total amount for {city} is {t}.")
    return Task(f"What is the total amount in {table} for customers in {city}?",
                [Call("read_query", {"query": f"SELECT sum(amount) FROM {table} WHERE city = '{city}'"},
                      f"[{{\"sum(amount)\": {total}}}]")],
                f"The total amount in {table} for {city} is {total}.", [(f"is {total}", f"is {round(total * 1.5, 2)}")],
                wrong, Call("describe_table", {"table_name": table}, "id INTEGER, city TEXT, amount REAL"))


def issues(rng: random.Random) -> Task:
    repo, other = rng.sample(PROJECTS, 2)
    number = rng.randint(10, 999)
    kind = rng.randrange(2)
    if kind == 0:
        title = rng.choice(["Crash on startup", "Login times out", "Wrong totals in export", "Memory leak in worker"])
        state = rng.choice(["open", "closed"])

        def wrong() -> tuple[dict[str, Any], str, str]:
            n = number + rng.randint(1, 40)
            return ({"owner": "acme", "repo": repo, "issue_number": n},
                    f"#{n} \"Docs typo\" state: open, assignee: none", f"Issue #{number} is \"Docs typo\" and open.")
        return Task(f"What is the status of issue #{number} in acme/{repo}?",
                    [Call("get_issue", {"owner": "acme", "repo": repo, "issue_number": number},
                          f"#{number} \"{title}\" state: {state}, assignee: {rng.choice(PEOPLE)}")],
                    f"Issue #{number} (\"{title}\") is {state}.",
                    [(f"is {state}", "is closed" if state == "open" else "is open")], wrong,
                    Call("search_issues", {"query": f"repo:acme/{repo} {title}", "perPage": 5},
                         f"#{number} \"{title}\""))
    label = rng.choice(["bug", "regression", "performance"])
    found = rng.randint(1, 7)

    def wrong() -> tuple[dict[str, Any], str, str]:
        m = rng.randint(1, 7)
        return ({"query": f"repo:acme/{other} is:open label:{label}", "perPage": 20},
                "\n".join(f"#{rng.randint(10, 999)} \"item {i}\"" for i in range(m)),
                f"There are {m} open {label} issues in acme/{repo}.")
    return Task(f"How many open issues labelled {label} does acme/{repo} have?",
                [Call("search_issues", {"query": f"repo:acme/{repo} is:open label:{label}", "perPage": 20},
                      "\n".join(f"#{rng.randint(10, 999)} \"{label} {i}\"" for i in range(found)))],
                f"acme/{repo} has {found} open issues labelled {label}.", [(f"has {found} open", f"has {found + 4} open")], wrong)


def calendar(rng: random.Random) -> Task:
    day = rng.randint(7, 27)
    date = f"2026-12-{day:02d}"
    kind = rng.randrange(2)
    if kind == 0:
        events = rng.sample(["Standup", "Design review", "1:1 with Dara", "Budget sync", "Lunch", "Demo"],
                            rng.randint(1, 4))

        def wrong() -> tuple[dict[str, Any], str, str]:
            d = f"2026-12-{day + 1:02d}"
            return ({"calendarId": "primary", "timeMin": f"{d}T00:00:00Z", "timeMax": f"{d}T23:59:59Z"},
                    "Retro 10:00-11:00", f"On {date} you have 1 event: Retro.")
        return Task(f"What's on my calendar on {date}?",
                    [Call("list_events", {"calendarId": "primary", "timeMin": f"{date}T00:00:00Z",
                                          "timeMax": f"{date}T23:59:59Z"},
                          "\n".join(f"{e} {9 + i}:00-{10 + i}:00" for i, e in enumerate(events)))],
                    f"On {date} you have {len(events)} event{'s' if len(events) > 1 else ''}: {', '.join(events)}.",
                    [(f"have {len(events)} event", f"have {len(events) + 2} event")], wrong)
    minutes = rng.choice([30, 45, 60, 90])
    slot = rng.choice(["10:00", "13:30", "15:00", "16:30"])

    def wrong() -> tuple[dict[str, Any], str, str]:
        return ({"calendarId": "primary", "date": date, "durationMinutes": minutes // 2 + 100},
                "09:00-12:00", f"You are free at 09:00 on {date}.")
    return Task(f"Find me a free {minutes}-minute slot on {date}.",
                [Call("find_free_slots", {"calendarId": "primary", "date": date, "durationMinutes": minutes},
                      f"{slot}-{int(slot[:2]) + 2}:{slot[3:]}")],
                f"You are free at {slot} on {date} for {minutes} minutes.", [(f"at {slot}", "at 08:15")], wrong,
                Call("list_events", {"calendarId": "primary", "timeMin": f"{date}T00:00:00Z",
                                     "timeMax": f"{date}T23:59:59Z"}, "Standup 09:00-09:15"))


def search(rng: random.Random) -> Task:
    city = rng.choice(CITIES)
    kind = rng.randrange(2)
    if kind == 0:
        temp = rng.randint(-5, 32)

        def wrong() -> tuple[dict[str, Any], str, str]:
            other = rng.choice([c for c in CITIES if c != city])
            t = rng.randint(-5, 32)
            return ({"query": f"weather {other} today", "count": 3}, f"{other} weather today: {t}°C",
                    f"It is {t}°C in {city} today.")
        return Task(f"What's the weather in {city} today?",
                    [Call("brave_web_search", {"query": f"weather {city} today", "count": 3},
                          f"1. {city} weather today: {temp}°C, {rng.choice(['sunny', 'cloudy', 'rain'])}")],
                    f"It is {temp}°C in {city} today.", [(f"is {temp}°C", f"is {temp + 9}°C")], wrong)
    place = rng.choice(["Café Lume", "Noodle Bar 9", "Green Fork", "Casa Azul"])
    rating = round(rng.uniform(3.0, 4.9), 1)

    def wrong() -> tuple[dict[str, Any], str, str]:
        return ({"query": f"bakeries in {city}", "count": 5}, f"1. Bread & Co ({city}) rating 4.0",
                "The best-rated place is Bread & Co, rated 4.0.")
    return Task(f"Find a well-rated restaurant in {city}.",
                [Call("brave_local_search", {"query": f"restaurants in {city}", "count": 5},
                      f"1. {place} ({city}) rating {rating}\n2. Other Place rating {round(rating - 0.4, 1)}")],
                f"{place} in {city} is rated {rating}.", [(f"rated {rating}", f"rated {round(rating - 1.1, 1)}")], wrong,
                Call("fetch_url", {"url": f"https://maps.example.com/{city.lower()}"}, f"{place}: open until 22:00"))


TASKS: dict[str, Callable[[random.Random], Task]] = {
    "filesystem": filesystem, "database": database, "issues": issues, "calendar": calendar, "search": search}
