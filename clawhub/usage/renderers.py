"""CSV for the usage API (``?format=csv``): the same rows as the JSON ``results``, one line each."""

import csv
import io

from rest_framework.renderers import BaseRenderer

from clawhub.usage.selectors import BY, usage_columns

# A spreadsheet runs a cell that starts with one of these as a formula; key names are user-chosen text.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value) -> str:
    if value is None:
        return ""
    text = str(value)
    if text.startswith(_FORMULA_STARTS) and not isinstance(value, int | float):
        return "'" + text
    return text


class UsageCSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out)
        if isinstance(data, dict) and "error" in data:
            # Errors keep their status code; the body says what went wrong in the format that was asked for.
            writer.writerow(["error", "message"])
            writer.writerow([_cell(data["error"].get("code")), _cell(data["error"].get("message"))])
        else:
            rows = data.get("results", []) if isinstance(data, dict) else data
            by = data.get("by") if isinstance(data, dict) else None
            # The header comes from the grouping, so an empty range still gives a file with its columns.
            columns = usage_columns(by=by) if by in BY else list(rows[0]) if rows else []
            if columns:
                writer.writerow(columns)
                writer.writerows([[_cell(row.get(c)) for c in columns] for row in rows])
        return out.getvalue().encode(self.charset)
