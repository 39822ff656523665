"""Timestamps PostgreSQL can hold and Python cannot, read as NULL plus a named flag.

Python's datetime holds years 1 to 9999; PostgreSQL's timestamptz holds 4713 BC to 294276 AD and
+/-infinity. Every reader of a timestamp column selects it through ``readable_ts`` so one such row
never breaks a read of many.
"""

from __future__ import annotations

from collections.abc import Sequence

# Python's datetime holds years 1 to 9999; PostgreSQL's timestamptz holds 4713 BC to 294276 AD and
# +/-infinity. The bounds keep two days of margin so no session time zone carries a value across.
_READABLE_FROM = "timestamptz '0001-01-03 00:00:00+00'"
_READABLE_BEFORE = "timestamptz '9999-12-29 00:00:00+00'"
INT4_MAX = 2_147_483_647


def readable(column: str) -> str:
    """SQL that is true when ``column`` holds a timestamp Python can represent (NULL for NULL)."""
    return f"({column} >= {_READABLE_FROM} AND {column} < {_READABLE_BEFORE})"


def readable_ts(column: str, alias: str | None = None) -> str:
    """Select ``column`` as itself when Python can represent it, else NULL (see ``readable``)."""
    return f"CASE WHEN {readable(column)} THEN {column} END AS {alias or column.rsplit('.', 1)[-1]}"


def _finite(column: str) -> str:
    return readable_ts(column)


def unreadable_columns(columns: Sequence[str], alias: str) -> str:
    """Select, as ``alias``, the array of the ``columns`` whose timestamp Python cannot represent."""
    arms = ", ".join(f"CASE WHEN NOT {readable(c)} THEN '{c.rsplit('.', 1)[-1]}' END" for c in columns)
    return f"array_remove(ARRAY[{arms}]::text[], NULL) AS {alias}"
