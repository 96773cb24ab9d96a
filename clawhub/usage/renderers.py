"""CSV for the usage API (``?format=csv``): the same rows as the JSON ``results``, one line each."""

import csv
import io

from rest_framework.renderers import BaseRenderer

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
            if rows:
                writer.writerow(list(rows[0]))
                writer.writerows([[_cell(v) for v in row.values()] for row in rows])
        return out.getvalue().encode(self.charset)
