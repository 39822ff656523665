"""Our own faults, loud on our own check: ``no_faults_of_ours`` on ``reconcile_error_rates``.

A job stopped by a fault of ours (a provider key missing or refused, a media store we cannot
write, the app's database dropping us mid-attempt; ``reconcile.cause.OurFault``) costs the job no
attempt and is never refunded for it, so nothing about the job turns red. This check does: a
reconcile run that met such a fault reports a failed evaluation at once, and the health schedule
re-evaluates it over the last few cadences, so it turns green (and its incident resolves) once the
cause is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa

from recon_dagster.config import Settings, settings
from recon_dagster.core.text import short_reason
from recon_dagster.defs.observe.outcomes import ERROR_RATES
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.reconcile.cause import OurFault
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.reconciler import JobOutcome

OURS_CHECK = "no_faults_of_ours"

# What to do about each fault, named in the check's one line.
FIX = {
    OurFault.CONFIGURATION.value: "set or correct the provider's key for the code server, daemon and run workers",
    OurFault.STORAGE.value: "make the media store writable by the run worker's user "
    f"({Settings.media_dir.name}'s owner, or the bucket's policy)",
    OurFault.DATABASE.value: "the app's database dropped or refused connections: check the server and "
    "its connection limit",
}

_RECENT = """
SELECT split_part(detail, ':', 1) AS fault, count(DISTINCT job_id) AS jobs,
       (array_agg(detail ORDER BY id DESC))[1] AS last
FROM reconcile_events
WHERE outcome = 'our_fault' AND created_at > now() - make_interval(secs => :window_s)
GROUP BY 1 ORDER BY 2 DESC
"""


def window_s() -> float:
    """Three cadences: a fault still there is met again within it; one fixed drops out of it."""
    return 3 * settings().reconcile_cadence_s


def ours_line(faults: Sequence[tuple[str, int, str]], window: str) -> str:
    """One line: how many jobs each fault stopped, the last detail, and the fix."""
    if not faults:
        return f"no job stopped by a fault of ours {window}"
    total = sum(n for _, n, _ in faults)
    fault, _, last = faults[0]
    parts = ", ".join(f"{f} {n}" for f, n, _ in faults)
    return (
        f"{total} job(s) stopped by a fault of ours {window} ({parts}), no attempt counted, "
        f"nothing refunded; fix: {FIX.get(fault, 'see the last detail')}; last: {short_reason(last, 240)}"
    )


def _evaluation(faults: Sequence[tuple[str, int, str]], window: str) -> dict[str, Any]:
    return {
        "passed": not faults,
        "severity": dg.AssetCheckSeverity.ERROR,
        "description": ours_line(faults, window),
        "metadata": {f"jobs/{f}": n for f, n, _ in faults} | {"window": window},
    }


@dg.asset_check(
    asset=ERROR_RATES,
    name=OURS_CHECK,
    description="No job was stopped by a fault of ours (a provider key missing or refused, a media store "
    "we cannot write, the app's database dropping us) in the last three cadences "
    f"({Settings.reconcile_cadence_s.name}). Such a job costs no attempt and is never refunded for it, so "
    "this check is where it shows.",
)
def no_faults_of_ours(database: DatabaseResource) -> dg.AssetCheckResult:
    seconds = window_s()
    with database.get_engine().connect() as conn:
        rows = conn.execute(sa.text(_RECENT), {"window_s": seconds}).all()
    faults = [(str(r.fault), int(r.jobs), str(r.last)) for r in rows]
    return dg.AssetCheckResult(**_evaluation(faults, f"in the last {seconds:g} s"))


def flag_ours(context: dg.OpExecutionContext, outcomes: Sequence[JobOutcome]) -> None:
    """From a reconcile run: one ERROR line and a failed evaluation of ``no_faults_of_ours`` at once
    when a fault of ours stopped some of its jobs."""
    hits = [o for o in outcomes if o.outcome is Outcome.OUR_FAULT]
    if not hits:
        return
    by_fault: dict[str, list[JobOutcome]] = {}
    for o in hits:
        by_fault.setdefault(o.detail.split(":", 1)[0], []).append(o)
    faults = [(f, len(os), os[-1].detail) for f, os in sorted(by_fault.items(), key=lambda kv: -len(kv[1]))]
    line = ours_line(faults, "in this run")
    context.log.error(line)
    # log_event takes a check evaluation at runtime (Dagster's own annotation lags behind it).
    context.log_event(
        dg.AssetCheckEvaluation(
            asset_key=ERROR_RATES, check_name=OURS_CHECK, **_evaluation(faults, "in this run")
        )  # type: ignore[arg-type]
    )
