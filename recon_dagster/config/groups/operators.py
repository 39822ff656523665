"""The operators' tools, and the fault injector's variables (read by ``core/crashpoints.py``).

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.parse import (
    http_url,
    lenient_flag,
    text,
)
from recon_dagster.config.var import named, setting


class OperatorGroup:
    __slots__ = ()

    # fmt: off
    # operators
    dagster_ui_url = setting(
        "operators", "URL", None,
        "Base URL of the Dagster webserver in the run links `recon-dagster explain` prints (and, when set, "
        "in `explain_job`'s metadata).",
        parse=http_url, bounds="http:// or https://",
        shown_default="`http://127.0.0.1:3000` (CLI); relative links in the UI",
    )
    operator = setting(
        "operators", "text", None,
        "Who `recon-dagster retry` / `fail` record as having acted (e.g. under `sudo` or a shared account). "
        "The UI's actions take the operator's name in their config instead: Dagster OSS has no users.",
        parse=text, shown_default="the OS user",
    )
    debug = setting(
        "operators", "flag", False, "`1`: CLI failures show their traceback (same as `--debug`).",
        parse=lenient_flag, bounds="`1`/`true`/`yes` = on", shown_default="—",
    )
    # fault injection (read by core/crashpoints.py itself: it must stay one global lookup)
    crash_at = named(
        "fault injection", "list of names", None,
        "Fault injection only: crash point name(s), comma-separated, at which the process SIGKILLs itself; "
        "never set in production.",
        shown_default="—",
    )
    crash_hits = named("fault injection", "whole number", 1, "Die on the n-th hit.")
    crash_hold = named(
        "fault injection", "flag", False, "Park earlier hits at the point.", shown_default="`0`",
    )
    crash_prob = named("fault injection", "number", 1.0, "Count a hit with this (seeded) probability.")
    crash_seed = named(
        "fault injection", "whole number", None, "Seed of that probability.", shown_default="—",
    )
    crash_log = named("fault injection", "path", None, "Log each hit to this file.", shown_default="—")
    # fmt: on
