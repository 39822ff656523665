"""What reconciliation did, as assets the UI plots: outcomes per provider kind, credit anomalies and
error rates per provider.

``reconcile_outcomes`` is materialized by every reconcile and sweep run (one materialization per
provider kind the run touched); ``credit_anomalies`` and ``reconcile_error_rates`` are refreshed by
the health schedule and carry the checks that turn red during an outage.
"""

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import dagster as dg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.config import Settings
from recon_dagster.core.kinds import KINDS, provider_names
from recon_dagster.db.sqltext import sql
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.operator.health import HealthPolicy, provider_figures
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.reconciler import JobOutcome

OUTCOMES = dg.AssetKey("reconcile_outcomes")
ANOMALIES = dg.AssetKey("credit_anomalies")
ERROR_RATES = dg.AssetKey("reconcile_error_rates")

provider_kind_partitions = dg.StaticPartitionsDefinition(list(KINDS))

# Outcome counts as they are plotted: force-fails and sweeps are their own series, never folded
# into "failed" (which is failed upstream, refunded).
SERIES = {
    "recovered": (Outcome.RECOVERED,),
    "failed_refunded": (Outcome.FAILED,),
    "swept": (Outcome.SWEPT,),
    "force_failed": (Outcome.EXHAUSTED,),
    "still_running": (Outcome.STILL_RUNNING,),
    "errors": (Outcome.ERROR,),
    "lost_race_or_skipped": (Outcome.LOST_RACE, Outcome.SKIPPED),
    # Polls the account's limiter never let out: rescheduled, no attempt (docs/operations.md, what counts as an attempt).
    "not_sent": (Outcome.NOT_SENT,),
    # Stopped by a fault of ours (configuration, storage, database): rescheduled, no attempt.
    "our_fault": (Outcome.OUR_FAULT,),
}

# Anomalies are judged over this recent window (the health schedule runs every 5 minutes, so an
# exhaustion stays red for a few of its runs).
RECENT_MINUTES = 30

WRITERS = ("reconcile_job", "sync_sweep_job")
# Dagster calls an asset that runs of an op job report "External Asset" and, without a sensor
# or schedule of its own, "No automations found". These assets are written by every reconcile
# and sweep run, so each says so: the description opens with it, the metadata names the jobs,
# and the Automation section shows the label of a condition that is true exactly when a run
# wrote the asset. Dagster evaluates conditions of materializable and observable assets only
# (no automation sensor is created for these; a test checks), so the condition is a label.
WRITTEN_BY_RUNS = dg.AutomationCondition.newly_updated().with_label(
    "written by every reconcile_job and sync_sweep_job run"
)


def _written_by_runs(**spec: Any) -> dg.AssetSpec:
    return dg.AssetSpec(
        group_name="reconciliation",
        kinds={"postgres"},
        automation_condition=WRITTEN_BY_RUNS,
        metadata={"written_by": ", ".join(WRITERS), "materialized_on_its_own": False},
        **spec,
    )


reconcile_outcomes = _written_by_runs(
    key=OUTCOMES,
    partitions_def=provider_kind_partitions,
    description="Written by every reconcile_job and sync_sweep_job run (not launched on its own). "
    "What reconcile runs did, per provider_kind: one materialization per run and kind "
    "labelled by kind and unit ('<kind>: recovered (jobs)', failed_refunded, swept, force_failed, "
    "still_running, errors, worked; '<kind>: credits_refunded (credits)'); a figure is written when "
    "it is not zero (or just fell to zero), so an outcome that never happened draws no flat plot.",
)


def _first_kind(provider: str) -> str:
    return min((k for k, spec in KINDS.items() if str(spec.provider) == provider), default=provider)


def provider_outcomes_key(provider: str) -> dg.AssetKey:
    return dg.AssetKey(["outcomes_by_provider", provider])


# Not partitioned, so the asset's plots are time series: one point per reconcile run that touched
# the provider, one panel per kind and outcome ("<kind>: <outcome> (jobs)", ``label``).
# The partitioned reconcile_outcomes plots by partition by default (Dagster's choice for a
# partitioned asset); its "Events" plots are the same per-kind time series of one kind each.
provider_outcome_specs = [
    _written_by_runs(
        key=provider_outcomes_key(p),
        description=f"Written by every reconcile_job and sync_sweep_job run that touched {p} "
        f"(not launched on its own). What each such run did to {p}'s jobs, over time: one point per "
        f"run and kind it worked, one plot per kind and outcome that ever happened ('{_first_kind(p)}: "
        "force_failed (jobs)', ...); an outcome that never happened has no plot.",
    )
    for p in provider_names()
]

# The unit of each plotted figure: Dagster titles each plot with its metadata label and calls the
# axes "Timestamp" (or "Partition") and "Value", so the label says what is counted.
UNITS = {
    **{name: "jobs" for name in SERIES},
    "jobs": "jobs",
    "credits_committed": "credits",
    "credits_refunded": "credits",
}


def label(kind: str, name: str) -> str:
    """A plotted figure's metadata label: ``<kind>: <figure> (<unit>)``. Dagster sorts the plots
    by label, so each kind's plots stand together."""
    return f"{kind}: {'worked' if name == 'jobs' else name} ({UNITS[name]})"


def plotted(figures: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures worth a point (pure): every non-zero one, and a zero only where the previous
    point of the same series was not (the line drops to zero once, then the series rests). Dagster
    draws one plot per numeric label it ever saw, so a figure that is always zero (no
    force-fail in a healthy week) is never written and never draws a flat panel; a missing
    point reads as none."""
    before = previous or {}

    def value(v: Any) -> Any:
        return getattr(v, "value", v)

    return {
        k: v
        for k, v in figures.items()
        if value(v) or (isinstance(value(before.get(k)), int | float) and value(before.get(k)))
    }


def kind_metadata(
    kind: str, outcomes: Sequence[JobOutcome], credits: dict[str, Any], previous: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One kind's plotted figures of one run (pure): labelled, zeros left out (``plotted``)."""
    figures = outcome_metadata(outcomes, credits)
    return plotted({label(kind, name): figures[name] for name in UNITS}, previous)


def provider_metadata(
    provider: str,
    by_kind: dict[str, list[JobOutcome]],
    credits: dict[str, Any],
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The points of ``provider``'s kinds this run worked (pure): ``kind_metadata`` of each."""
    meta: dict[str, Any] = {}
    for kind in sorted(k for k, spec in KINDS.items() if str(spec.provider) == provider and by_kind.get(k)):
        meta.update(kind_metadata(kind, by_kind[kind], credits, previous))
    return meta


def _previous(
    context: dg.OpExecutionContext, key: dg.AssetKey, partition: str | None = None
) -> dict[str, Any]:
    """The newest value of each label over the asset's (partition's) last few points: where a
    series stood before this run (``plotted``). Empty when they cannot be read."""
    try:
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None),
            limit=10,
        ).records
    except Exception as exc:  # the figures must not fail a run that did its work
        context.log.warning(f"the last points of {key.to_user_string()} could not be read: {exc}")
        return {}
    out: dict[str, Any] = {}
    for record in records:  # newest first
        materialization = record.asset_materialization
        for name, entry in (materialization.metadata if materialization else {}).items():
            out.setdefault(name, entry.value)
    return out


def _credits(conn: sa.Connection, job_ids: Sequence[str]) -> dict[str, tuple[str, Decimal]]:
    if not job_ids:
        return {}
    rows = conn.execute(
        sa.text("SELECT job_id, status, amount FROM usage_logs WHERE job_id = ANY(:ids)").bindparams(
            sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))
        ),
        {"ids": list(job_ids)},
    )
    return {str(r.job_id): (r.status, Decimal(r.amount)) for r in rows}


def outcome_metadata(
    outcomes: Sequence[JobOutcome], credits: dict[str, tuple[str, Decimal]]
) -> dict[str, Any]:
    """The plotted figures of one kind's outcomes in one run (pure)."""
    counts = Counter(o.outcome for o in outcomes)
    meta: dict[str, Any] = {name: sum(counts[o] for o in members) for name, members in SERIES.items()}
    committed = refunded = Decimal(0)
    for o in outcomes:
        status, amount = credits.get(str(o.job_id), ("", Decimal(0)))
        if o.outcome is Outcome.RECOVERED and status == "committed":
            committed += amount
        elif o.outcome in (Outcome.FAILED, Outcome.SWEPT, Outcome.EXHAUSTED) and status == "refunded":
            refunded += amount
    meta["credits_committed"] = float(committed)
    meta["credits_refunded"] = float(refunded)
    meta["jobs"] = len(outcomes)
    return meta


def report_outcomes(
    context: dg.OpExecutionContext, outcomes: Sequence[JobOutcome], database: DatabaseResource
) -> None:
    """Log one ``reconcile_outcomes`` materialization per provider kind this run touched."""
    by_kind: dict[str, list[JobOutcome]] = defaultdict(list)
    for o in outcomes:
        kind = o.provider_kind
        if kind is None and context.has_partition_key:
            kind = context.partition_key  # skipped jobs carry no row, hence no kind
        if kind is not None and kind in KINDS:
            by_kind[kind].append(o)
    if not by_kind:
        return
    try:
        with database.get_engine().connect() as conn:
            credits = _credits(conn, [str(o.job_id) for group in by_kind.values() for o in group])
    except Exception as exc:  # the figures must not fail a run that did its work
        context.log.warning(f"credits of this run's jobs could not be read: {exc}")
        credits = {}
    for kind, group in sorted(by_kind.items()):
        previous = _previous(context, OUTCOMES, kind)
        context.log_event(
            dg.AssetMaterialization(
                asset_key=OUTCOMES, partition=kind, metadata=kind_metadata(kind, group, credits, previous)
            )
        )
    for provider in sorted({str(KINDS[k].provider) for k in by_kind}):
        key = provider_outcomes_key(provider)
        context.log_event(
            dg.AssetMaterialization(
                asset_key=key, metadata=provider_metadata(provider, by_kind, credits, _previous(context, key))
            )
        )


# --- credit anomalies -------------------------------------------------------------------------


@dg.asset(
    key=ANOMALIES,
    group_name="reconciliation",
    description="Rows of the credit_anomalies table per reason: all time and in the last "
    f"{RECENT_MINUTES} minutes (reconcile_exhausted: a job force-failed at the attempt cap).",
)
def credit_anomalies(
    context: dg.AssetExecutionContext, database: DatabaseResource
) -> dg.MaterializeResult[Any]:
    with database.get_engine().connect() as conn:
        rows = conn.execute(
            sa.text(
                """
                SELECT reason, count(*) AS total,
                       count(*) FILTER (WHERE created_at > now() - make_interval(mins => :m)) AS recent
                FROM credit_anomalies GROUP BY reason ORDER BY reason
                """
            ),
            {"m": RECENT_MINUTES},
        ).all()
    meta: dict[str, Any] = {
        "total": sum(int(r.total) for r in rows),
        "recent": sum(int(r.recent) for r in rows),
    }
    meta["reconcile_exhausted/recent"] = 0
    for r in rows:
        meta[f"{r.reason}/total"] = int(r.total)
        meta[f"{r.reason}/recent"] = int(r.recent)
    context.log.info(
        f"{meta['total']} credit anomalies, {meta['recent']} in the last {RECENT_MINUTES} minutes"
    )
    return dg.MaterializeResult(metadata=meta)


@dg.asset_check(
    asset=ANOMALIES,
    description=f"No job was force-failed at the attempt cap (reconcile_exhausted) in the last "
    f"{RECENT_MINUTES} minutes: each such row is a job reconciliation could not settle in time.",
)
def no_new_exhausted_jobs(database: DatabaseResource) -> dg.AssetCheckResult:
    result = recent_anomalies_check(database, "reconcile_exhausted", "new_exhausted", with_amount=True)
    if result.passed:
        return result
    with database.get_engine().connect() as conn:
        window = exhausted_window(conn)
    return dg.AssetCheckResult(
        passed=False,
        severity=result.severity,
        description=window.line,
        metadata={**window.metadata(), **dict(result.metadata)},
    )


@dataclass(frozen=True)
class ExhaustedWindow:
    """The force-fails at the cap of the check's window: how many, per kind, and the newest's id."""

    jobs: int
    kinds: dict[str, int]
    newest: int | None

    @property
    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        return (
            f"{self.jobs} job(s) force-failed at the attempt cap and refunded in the last {RECENT_MINUTES} min"
            + (f" ({kinds})" if kinds else "")
        )

    def metadata(self) -> dict[str, Any]:
        # "news" first: the alert sensor tells the open incident again when it changes.
        return {
            "news": self.newest if self.newest is not None else "-",
            "kinds": dict(sorted(self.kinds.items())),
        }


def exhausted_window(conn: sa.Connection) -> ExhaustedWindow:
    rows = conn.execute(
        sa.text(
            """
            SELECT coalesce(j.provider_kind, '(none)') AS kind, count(*) AS n, max(a.id) AS newest
            FROM credit_anomalies a LEFT JOIN jobs j ON j.id = a.job_id
            WHERE a.reason = 'reconcile_exhausted' AND a.created_at > now() - make_interval(mins => :m)
            GROUP BY 1
            """
        ),
        {"m": RECENT_MINUTES},
    ).all()
    newest = max((int(r.newest) for r in rows), default=None)
    return ExhaustedWindow(sum(int(r.n) for r in rows), {r.kind: int(r.n) for r in rows}, newest)


def recent_anomalies_check(
    database: DatabaseResource, reason: str, count_label: str, *, with_amount: bool = False
) -> dg.AssetCheckResult:
    """Red while ``credit_anomalies`` holds a ``reason`` row from the last ``RECENT_MINUTES``:
    how many, and a sample of their job ids and details (refunded amount with ``with_amount``)."""
    with database.get_engine().connect() as conn:
        rows = conn.execute(
            sa.text(
                """
                SELECT job_id, amount, details FROM credit_anomalies
                WHERE reason = :reason AND created_at > now() - make_interval(mins => :m)
                ORDER BY created_at DESC LIMIT 50
                """
            ),
            {"reason": reason, "m": RECENT_MINUTES},
        ).all()

    def sample(r: Any) -> dict[str, Any]:
        refunded = {"refunded": float(r.amount or 0)} if with_amount else {}
        return {"job_id": str(r.job_id), **refunded, **(r.details or {})}

    return dg.AssetCheckResult(
        passed=not rows,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={count_label: len(rows), "sample": dg.MetadataValue.json([sample(r) for r in rows[:10]])},
    )


# Attempts per provider kind and cause in the window (each attempt once, unlike the judged figures).
_ATTEMPTS = sql(
    """
    SELECT provider_kind, count(*) AS n, count(*) FILTER (WHERE cause = 'provider') AS unanswered,
           count(*) FILTER (WHERE cause = 'job') AS own
    FROM reconcile_events
    WHERE created_at > now() - make_interval(secs => :window_s) AND provider_kind IS NOT NULL
      AND cause IS NOT NULL AND cause <> 'not_asked'
    GROUP BY provider_kind
    """
)


@dg.asset(
    key=ERROR_RATES,
    group_name="reconciliation",
    description=f"Per provider over the last {Settings.health_window_s.name} (30 min): the distinct jobs polled, "
    "those whose latest poll got no answer, those failed by their own result (never the provider's "
    "fault), and the attempts behind them. provider_health's checks judge the same figures.",
)
def reconcile_error_rates(
    context: dg.AssetExecutionContext, database: DatabaseResource
) -> dg.MaterializeResult[Any]:
    policy = HealthPolicy.from_config()
    with database.get_engine().connect() as conn:
        figures = provider_figures(conn, policy.window_s)
        attempts: dict[str, list[int]] = {p: [0, 0, 0] for p in provider_names()}
        for r in conn.execute(_ATTEMPTS, {"window_s": policy.window_s}):
            kind = KINDS.get(r.provider_kind)
            if kind is not None:
                totals = attempts[kind.provider]
                for i, n in enumerate((r.n, r.unanswered, r.own)):
                    totals[i] += int(n)
    meta: dict[str, Any] = {"window_s": policy.window_s}
    for provider, f in sorted(figures.items()):
        meta[f"jobs/{provider}"] = f.jobs
        meta[f"jobs_without_answer/{provider}"] = f.unanswered
        meta[f"jobs_failed_by_own_result/{provider}"] = f.own_errors
        meta[f"no_answer_rate/{provider}"] = round(f.unanswered / f.jobs, 4) if f.jobs else 0.0
        meta[f"attempts/{provider}"] = attempts[provider][0]
        meta[f"attempts_without_answer/{provider}"] = attempts[provider][1]
        meta[f"attempts_failed_by_own_result/{provider}"] = attempts[provider][2]
    return dg.MaterializeResult(metadata=meta)


HEALTH_ASSETS = (ANOMALIES, ERROR_RATES)
