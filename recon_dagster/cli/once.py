"""``recon-dagster reconcile --once`` as the user sees it: the tick's summary line, and any failed
run or provider error as one more line that says what failed, never Dagster's harness output.

``recon_dagster.cli.run_once`` does the work (the same sensor and jobs the daemon uses); this module owns
the instance it runs on and what reaches the terminal.
"""

from __future__ import annotations

import io
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from datetime import UTC, datetime
from typing import Protocol, TextIO

import dagster as dg
import sqlalchemy as sa

from recon_dagster.cli.errors import FIX_DEBUG, FIX_UNAVAILABLE, CliError

# The start of a log record on the console: Dagster's ("2026-11-30 16:50:01 +0000 - dagster -
# ERROR - ...") and the logging module's ("2026-11-30 16:50:35,538 WARNING ...").
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_DAGSTER_ERROR = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - dagster - ERROR - ")
_MISSING_ENV = re.compile(r'environment variable "(\w+)" which is not set')


class _WithoutDagsterErrors(io.TextIOBase):
    """Passes console output through, minus Dagster's ERROR records and the stack traces under
    them: a failed run is summarised in one line instead (its full story stays in the run's
    event log, and ``--debug`` shows it here)."""

    def __init__(self, target: TextIO) -> None:
        self._target = target
        self._pending = ""
        self._dropping = False

    def write(self, s: str) -> int:
        self._pending += s
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if _RECORD.match(line):
                self._dropping = bool(_DAGSTER_ERROR.match(line))
            if not self._dropping:
                self._target.write(line + "\n")
        return len(s)

    def flush(self) -> None:
        self._target.flush()


@contextmanager
def _instance() -> Iterator[dg.DagsterInstance]:
    """``$DAGSTER_HOME``'s instance, else a throwaway persistent one (sensor contexts need one)."""
    import os

    if os.environ.get("DAGSTER_HOME"):
        with dg.DagsterInstance.get() as inst:
            yield inst
        return
    with tempfile.TemporaryDirectory(prefix="recon-once-") as tmp, dg.DagsterInstance.local_temp(tmp) as inst:
        yield inst


class _ErrorInfo(Protocol):
    """What is read of Dagster's SerializableErrorInfo: the error it was caused by, and its text."""

    @property
    def cause(self) -> _ErrorInfo | None: ...

    def to_string(self) -> str: ...


def _innermost(error: _ErrorInfo) -> _ErrorInfo:
    while error.cause is not None:
        error = error.cause
    return error


def run_failures(instance: dg.DagsterInstance, since: float) -> list[tuple[str, str]]:
    """(``job (partition)``, the innermost error's first line) of every run that failed since."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.FAILURE], created_after=datetime.fromtimestamp(since, UTC)
        )
    )
    failures = []
    for run in reversed(list(runs)):
        message = "no error recorded"
        records = instance.all_logs(
            run.run_id, of_type={dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE}
        )
        for record in records:
            event = record.dagster_event
            error = getattr(event.event_specific_data, "error", None) if event else None
            if error is not None:
                message = _explain_error(_innermost(error).to_string())
                break
        partition = run.tags.get("dagster/partition")
        failures.append((f"{run.job_name}{f' ({partition})' if partition else ''}", message))
    return failures


def _explain_error(text: str) -> str:
    missing = _MISSING_ENV.search(text)
    if missing:
        return f"environment variable {missing.group(1)} is not set"
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    # "package.module.ClassName: message" -> "ClassName: message"
    return re.sub(r"^(?:\w+\.)+(\w+): ", r"\1: ", first)


def _fix_for(messages: list[str]) -> str:
    if any(m.startswith("environment variable") for m in messages):
        return "set it (docs/configuration.md) and run `recon-dagster reconcile --once` again"
    if any("database unavailable" in m for m in messages):
        return FIX_UNAVAILABLE
    if messages and all(" outage: none of the " in m for m in messages):
        # An outage run fails on purpose (the UI shows it red); its jobs' attempts were counted.
        return "the provider is not answering; each job is retried after the cadence (`recon-dagster status` shows when)"
    return f"{FIX_DEBUG} and Dagster's log of the run"


def provider_errors(since: float) -> str | None:
    """``kind xN: first error`` for the jobs whose attempt ended in an error since ``since``."""
    from recon_dagster.db.engine import get_engine

    with get_engine().connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT COALESCE(provider_kind, '(none)') AS kind, count(*) AS n, min(detail) AS detail "
                "FROM reconcile_events WHERE outcome = 'error' AND created_at >= to_timestamp(:t) "
                "GROUP BY 1 ORDER BY 1"
            ),
            {"t": since},
        ).all()
    if not rows:
        return None
    return ", ".join(
        f"{r.kind} x{r.n}: {(r.detail or '').splitlines()[0] if r.detail else '?'}" for r in rows
    )


def run_reconcile_once(*, sweep: bool, debug: bool) -> int:
    """One tick, printed as its summary line (+ an ``errors:`` line); failed runs raise CliError."""
    from recon_dagster.cli.run_once import reconcile_once

    since = time.time()
    with _instance() as inst:
        console = sys.stderr if debug else _WithoutDagsterErrors(sys.stderr)
        with redirect_stderr(console):
            report = reconcile_once(instance=inst, sweep=sweep)
        failures = run_failures(inst, since) if report.failed_runs else []
    if report.skip_reason and report.runs <= 1:
        print(f"sensor: {report.skip_reason}")
    print(report.line())
    errors = provider_errors(since) if report.summary.errors else None
    if errors:
        print(
            f"errors: {errors.replace('; ', ', ')}; "
            "each is retried after the cadence (`recon-dagster status` shows when)"
        )
    if report.failed_runs:
        listed = ", ".join(f"{name}: {message}" for name, message in failures) or "see the Dagster UI"
        raise CliError(
            f"{report.failed_runs} of {report.runs} runs failed: {listed}",
            _fix_for([m for _, m in failures]),
        )
    if report.unconfigured:
        # The tick did what it could; jobs it was asked to reconcile were left untouched.
        from recon_dagster.core.kinds import provider_spec

        left = ", ".join(
            f"{n} of {p} ({provider_spec(p).settings.key_env} is not set)"
            for p, n in sorted(report.unconfigured.items())
        )
        raise CliError(
            f"due jobs left in flight, their provider not configured: {left}",
            "set the key (docs/configuration.md) and run `recon-dagster reconcile --once` again",
        )
    return 0
