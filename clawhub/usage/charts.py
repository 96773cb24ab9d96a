"""The usage page's charts, from ``usage_summary`` rows: per day, key, model or member, requests (split into
answered and errors) and tokens (prompt and completion), as stacked bars."""

from datetime import date, timedelta

from clawhub.core.charts import Chart, bar_chart

# Rows beyond these in a per-key/model/member chart are left to the table under it (busiest first).
MAX_ROWS = 12
REQUEST_SERIES = ("answered", "errors")
TOKEN_SERIES = ("prompt", "completion")


def row_label(row: dict, *, by: str) -> str:
    """What a chart (and a reader) calls one grouped row; unique within a summary."""
    if by == "day":
        return row["day"].isoformat()
    if by == "key":
        if row["key_id"] is None:
            return "deleted keys"
        return f"{row['key_name']} …{row['key_last4']}"
    if by == "user":
        return row["user_email"] or f"user {row['user_id']}"
    if by == "group":
        return row["group_slug"] or "personal"
    return row["model"]


def _days(rows: list[dict], since: date, until: date) -> list[dict]:
    """One row per day of the range, oldest first, zeros where nothing was used."""
    found = {row["day"]: row for row in rows}
    empty = {"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
    return [found.get(since + timedelta(days=i), {**empty, "day": since + timedelta(days=i)})
            for i in range((until - since).days + 1)]


def usage_charts(*, rows: list[dict], by: str, since: date, until: date, noun: str) -> tuple[Chart, Chart]:
    """(requests chart, tokens chart) for one grouping; ``noun`` names the categories ("day", "key")."""
    if by == "day":
        rows = _days(rows, since, until)
    else:
        rows = rows[:MAX_ROWS]
    labels = [row_label(r, by=by) for r in rows]
    horizontal = by != "day"
    per = f"per {noun}"
    short = {"tick_label": (lambda day: day[5:])} if by == "day" else {}  # 2026-12-01 -> 12-01
    requests = bar_chart(
        title=f"Requests {per}", categories=labels, horizontal=horizontal,
        series={"answered": [r["requests"] - r["errors"] for r in rows],
                "errors": [r["errors"] for r in rows]},
        x_label="requests" if horizontal else f"{noun} (UTC)", y_label=noun if horizontal else "requests",
        **short,
    )
    tokens = bar_chart(
        title=f"Tokens {per}", categories=labels, horizontal=horizontal,
        series={"prompt": [r["prompt_tokens"] for r in rows],
                "completion": [r["completion_tokens"] for r in rows]},
        x_label="tokens" if horizontal else f"{noun} (UTC)", y_label=noun if horizontal else "tokens",
        colors=("#009e73", "#cc79a7"), **short,
    )
    return requests, tokens
