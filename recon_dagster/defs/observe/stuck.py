"""The console's retries tab: ``stuck_jobs`` (the in-flight jobs that are stuck, ``StuckRule``, each
with why, attempt n/max, next attempt, lease holder and the last reason, whole) and the operator's
actions on one job from the Launchpad, ``retry_job_now`` and ``fail_and_refund_job``
(``recon_dagster.operator.actions``). A job past its threshold that runs as it should is counted
(``running_fine``), not listed.

``stuck_jobs`` is live: besides the health schedule, every reconcile or sweep run that worked a job
records it again once its outcomes are written (``report_stuck``), so a job force-failed a minute
ago is not still listed. Its ``table`` is Dagster table metadata (sortable in the console), each row
with its kind, attempt n of max, next attempt, lease, last reason, and links to the job's runs (the
Runs page filtered by its tag) and to its story (``recon-dagster explain``).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from recon_dagster.config import settings
from recon_dagster.core.runtags import ACTION_JOB_TAG, JOB_TAG_PREFIX, JOB_TAG_VALUE, OPERATOR_TAG, ROLE_TAG
from recon_dagster.core.text import short_reason
from recon_dagster.db.jobs import _threshold_case
from recon_dagster.db.timestamps import readable, readable_ts
from recon_dagster.defs.explain.stories import PARTITIONS, STORIES_PER_RUN, record_stories, story_url
from recon_dagster.defs.groups import ONCALL
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.operator.actions import OPERATOR_OUTCOMES, Done, OperatorError, fail_now, retry_now
from recon_dagster.operator.explain import ui_base_url
from recon_dagster.providers import ProvidersResource

STUCK = dg.AssetKey("stuck_jobs")
TABLE_ROWS = 100

# Events that say nothing of the job's own progress: another writer won, the run did not work it,
# our limiter kept the poll in, or an operator acted. The newest other event is its last attempt.
QUIET_OUTCOMES = ("skipped", "lost_race", "not_sent", *OPERATOR_OUTCOMES)
# What a job's last attempt looked like, and how far it is from the cap: why it is stuck, or NULL.
_JUDGED = f"""
WITH flight AS (
  SELECT j.*, last.outcome AS last_outcome, last.cause AS last_cause, last.created_at AS last_at
  FROM jobs j
  LEFT JOIN LATERAL (
    SELECT e.outcome, e.cause, e.created_at FROM reconcile_events e
    WHERE e.job_id = j.id AND e.outcome <> ALL(CAST(:quiet AS text[]))
    ORDER BY e.created_at DESC, e.id DESC LIMIT 1
  ) last ON true
  WHERE j.status IN ('pending', 'processing')
    AND (j.reconcile_attempts > 0
         OR (j.provider_call_started_at < now() - {_threshold_case("j.provider_kind")}
             AND isfinite(j.provider_call_started_at)))
), judged AS (
  SELECT flight.*, CASE
    WHEN reconcile_attempts >= :cap - :near THEN 'near_cap'
    WHEN last_outcome IS NULL AND reconcile_attempts = 0 THEN
      CASE WHEN provider_call_started_at < now() - {_threshold_case("provider_kind")} - :grace * interval '1 second'
           THEN 'not_reached' END
    WHEN last_outcome IS NULL THEN 'no_record'
    WHEN last_outcome = 'still_running' AND last_cause = 'answered' THEN
      CASE WHEN last_at < now() - :grace * interval '1 second' THEN 'not_polled' END
    WHEN last_cause = 'provider' THEN 'no_answer'
    WHEN last_cause = 'job' THEN 'unusable'
    ELSE 'last_' || last_outcome
  END AS stuck_why
  FROM flight
)"""

STUCK_SQL = f"""{_JUDGED}
SELECT id, provider_kind, reconcile_attempts, {readable_ts("reconcile_next_at")},
       reconcile_next_at::text AS next_at_text, reconcile_lease_owner,
       CASE WHEN reconcile_lease_expires_at > now() AND {readable("reconcile_lease_expires_at")}
         THEN reconcile_lease_expires_at END AS lease_until,
       CASE WHEN reconcile_lease_expires_at > now() THEN reconcile_lease_expires_at::text END AS lease_text,
       reconcile_last_error, stuck_why, last_outcome,
       CASE WHEN last_at IS NOT NULL THEN floor(extract(epoch FROM now() - last_at) / 60) END AS last_min
FROM judged
WHERE stuck_why IS NOT NULL
ORDER BY reconcile_attempts DESC, provider_call_started_at
LIMIT :limit
"""

COUNT_SQL = f"""{_JUDGED}
SELECT count(*) FILTER (WHERE stuck_why IS NOT NULL) AS stuck,
       count(*) FILTER (WHERE stuck_why IS NULL) AS running_fine
FROM judged
"""


@dataclass(frozen=True)
class StuckRule:
    """What makes an in-flight job stuck rather than running as it should (issue 55, item 6).

    A job past its kind's stale threshold is worked by the reconciler at the cadence; it runs as it
    should while its newest attempt got the provider's answer that the task still runs, that answer
    is under ``grace`` old (two cadences, at least 2 minutes: a poll was made on time), and it has more than ``near``
    attempts before the cap. A job not worked yet is fine for ``grace`` past its threshold. Every
    other in-flight job past its threshold is stuck, and says why (``WHY``)."""

    cap: int
    cadence_s: float
    near: int = 2
    # A poll is not made the instant it is due (a sensor tick, a run's launch): at a short cadence
    # two cadences would call a job worked on time "not polled".
    min_grace_s: float = 120.0

    @property
    def grace_s(self) -> float:
        return max(2 * self.cadence_s, self.min_grace_s)

    @classmethod
    def configured(cls) -> "StuckRule":
        now = settings()
        return cls(cap=now.max_attempts, cadence_s=now.reconcile_cadence_s)

    def params(self) -> dict[str, Any]:
        return {"quiet": list(QUIET_OUTCOMES), "cap": self.cap, "near": self.near, "grace": self.grace_s}


def _why(r: Any, rule: StuckRule) -> str:
    """Why the row is stuck, in words (the ``why`` column)."""
    code = r["stuck_why"]
    minutes = None if r["last_min"] is None else int(r["last_min"])
    ago = "never" if minutes is None else "under a minute ago" if minutes < 1 else f"{minutes} min ago"
    if code == "near_cap":
        left = max(rule.cap - int(r["reconcile_attempts"]), 0)
        return f"{left} attempt(s) before the cap force-fails and refunds it"
    if code == "not_reached":
        return f"no attempt yet, more than {rule.grace_s / 60:g} min past its threshold: not reached"
    if code == "no_record":
        return "attempts counted but none on record"
    if code == "not_polled":
        return f"still running upstream at its last poll, {ago}: not polled since"
    if code == "no_answer":
        return f"the provider did not answer its last poll ({ago})"
    if code == "unusable":
        return f"its result was not usable at its last attempt ({ago})"
    return f"its last attempt ended {str(code).removeprefix('last_')} ({ago})"


def stuck_rows(
    conn: sa.Connection, limit: int = TABLE_ROWS, rule: StuckRule | None = None
) -> list[dict[str, Any]]:
    rule = rule or StuckRule.configured()
    rows = conn.execute(sa.text(STUCK_SQL), {"limit": limit, **rule.params()}).mappings().all()
    return [
        {
            "job_id": str(r["id"]),
            "provider_kind": r["provider_kind"] or "(none)",
            "attempt": f"{r['reconcile_attempts']}/{rule.cap}",
            "attempts_left": max(rule.cap - int(r["reconcile_attempts"]), 0),
            "why": _why(r, rule),
            # A time Python cannot hold (infinity, past 9999) is shown as PostgreSQL writes it:
            # one such row never stops the table (the sweep clamps it).
            "next_attempt": _when(r["reconcile_next_at"], r["next_at_text"]),
            "lease": f"{r['reconcile_lease_owner']} until {_when(r['lease_until'], r['lease_text'])}"
            if r["lease_text"]
            else "-",
            "last_upstream": _cell(r["reconcile_last_error"]),
        }
        for r in rows
    ]


def stuck_counts(conn: sa.Connection, rule: StuckRule | None = None) -> tuple[int, int]:
    """(stuck, running as they should) among the in-flight jobs past their threshold."""
    rule = rule or StuckRule.configured()
    r = conn.execute(sa.text(COUNT_SQL), rule.params()).one()
    return int(r.stuck), int(r.running_fine)


def _when(value: object, text: str | None = None) -> str:
    if value is None:
        return text or "now"
    try:
        return f"{value:%Y-%m-%d %H:%M:%S}"
    except (TypeError, ValueError):
        return str(value)


def _cell(text: str | None, width: int = 400) -> str:
    """A table cell: one line, never a "|", cut at a word boundary (a reason is read whole)."""
    return short_reason(text, width).replace("|", "/")


def runs_link(job_id: str, base: str | None) -> str:
    """The Runs page filtered by the job's tag: every run that worked it."""
    tag = quote(f"tag:{JOB_TAG_PREFIX}{job_id}={JOB_TAG_VALUE}", safe="")
    return f"{base or ''}/runs?q%5B%5D={tag}"


_COLUMNS = (
    ("job_id", "string", "the app's jobs.id"),
    ("kind", "string", "provider kind"),
    ("attempt", "string", "attempt n of max"),
    ("attempts_left", "int", "attempts before the cap force-fails and refunds it"),
    ("why", "string", "why it is stuck: no answer, not polled, near the cap, not reached, unusable result"),
    ("next_attempt", "string", "when it is due again (UTC)"),
    ("lease", "string", "who holds it now"),
    ("last_reason", "string", "what upstream said, or why the result was unusable"),
    ("runs", "string", "its runs: the Runs page filtered by its tag"),
    ("story", "string", "its story: its job_story page (also `recon-dagster explain JOB_ID`)"),
)


def story_cell(job_id: str, base: str | None, storied: set[str] | None) -> str:
    """Where a row's story is: its job_story page when that page exists (``storied`` None: assume
    it does), else the command that tells it (a link to a partition never recorded is a dead page)."""
    if storied is None or str(job_id) in storied:
        return story_url(job_id, base)
    return f"recon-dagster explain {job_id}"


def stuck_table(
    rows: list[dict[str, Any]], base: str | None, storied: set[str] | None = None
) -> dg.TableMetadataValue:
    """The rows as Dagster table metadata (the console sorts it by any column)."""
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "job_id": r["job_id"],
                    "kind": r["provider_kind"],
                    "attempt": r["attempt"].replace("/", " of "),
                    "attempts_left": r["attempts_left"],
                    "why": r["why"],
                    "next_attempt": r["next_attempt"],
                    "lease": r["lease"],
                    "last_reason": r["last_upstream"],
                    "runs": runs_link(r["job_id"], base),
                    "story": story_cell(r["job_id"], base, storied),
                }
            )
            for r in rows
        ],
        schema=dg.TableSchema(
            columns=[dg.TableColumn(name, type_, description=d) for name, type_, d in _COLUMNS]
        ),
    )


def stuck_metadata(
    rows: list[dict[str, Any]],
    base: str | None,
    counts: tuple[int, int] | None = None,
    storied: set[str] | None = None,
) -> dict[str, Any]:
    """``stuck`` counts every stuck job (the table shows the first ``TABLE_ROWS``);
    ``running_fine`` the in-flight jobs past their threshold that run as they should (not listed)."""
    stuck, fine = counts if counts is not None else (len(rows), 0)
    return {
        "stuck": stuck,
        "running_fine": fine,
        "near_cap": sum(1 for r in rows if r["attempts_left"] <= 2),
        "table": stuck_table(rows, base, storied),
        "jobs": dg.MetadataValue.md(_markdown(rows, base, storied)),
    }


# Stories of listed jobs without one that a reconcile run records on top of its own (it has just
# recorded up to ``STORIES_PER_RUN``); the health schedule's refresh records up to that many.
STORIES_BY_RUNS = 10


def with_stories(
    context: dg.OpExecutionContext, engine: sa.Engine, job_ids: list[str], limit: int = STORIES_PER_RUN
) -> set[str]:
    """The jobs of ``job_ids`` whose ``job_story`` page exists, after recording the story of those
    no run recorded yet (a job never polled, one a run's share of stories left out), at most
    ``limit`` of them, in the table's order. Never raises."""
    try:
        # One query for every partition: 0.16 s at 20,000 of them on PostgreSQL, where a look per
        # row costs 9 ms each (a connection per call; benchmarks/job_stories.py).
        every = set(context.instance.get_dynamic_partitions(PARTITIONS))
    except Exception as exc:
        context.log.warning(f"which stuck jobs have a story page could not be read: {exc}")
        return set()
    have = {j for j in job_ids if j in every}
    missing = [j for j in job_ids if j not in have][: max(limit, 0)]
    if missing and record_stories(context, engine, missing):
        have |= set(missing)  # their partitions were added (a story that could not be read is logged)
    return have


def _read(
    engine: sa.Engine, context: dg.OpExecutionContext | None = None, stories: int = STORIES_PER_RUN
) -> dict[str, Any]:
    rule = StuckRule.configured()
    # The rows' connection goes back before any story is read: a story takes a connection of its
    # own, and holding two at once deadlocked a run behind a one-connection transaction pooler
    # (and took two of a run worker's share of the budget).
    with engine.connect() as conn:
        rows = stuck_rows(conn, rule=rule)
        counts = stuck_counts(conn, rule)
    ids = [r["job_id"] for r in rows]
    storied = with_stories(context, engine, ids, stories) if context is not None else None
    return stuck_metadata(rows, ui_base_url(None), counts, storied)


def report_stuck(context: dg.OpExecutionContext, database: DatabaseResource) -> None:
    """Record ``stuck_jobs`` again from a run that changed it (never fails the run's work)."""
    try:
        meta = _read(database.get_engine(), context, STORIES_BY_RUNS)
    except Exception as exc:
        context.log.warning(f"stuck_jobs could not be refreshed: {exc}")
        return
    context.log_event(dg.AssetMaterialization(asset_key=STUCK, metadata=meta))


def _markdown(rows: list[dict[str, Any]], base: str | None = None, storied: set[str] | None = None) -> str:
    if not rows:
        return "_no stuck job: every in-flight job past its threshold runs as it should_"
    head = "| job_id | kind | attempt | why stuck | next attempt | lease | last reason (what upstream said, or why the result was unusable) | runs | story |\n|---|---|---|---|---|---|---|---|---|"
    body = [
        f"| {r['job_id']} | {r['provider_kind']} | {r['attempt']} | {r['why']} | {r['next_attempt']} | {r['lease']} | {r['last_upstream']} | [runs]({runs_link(r['job_id'], base)}) | {_story_md(r['job_id'], base, storied)} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def _story_md(job_id: str, base: str | None, storied: set[str] | None) -> str:
    cell = story_cell(job_id, base, storied)
    return f"`{cell}`" if cell.startswith("recon-dagster ") else f"[story]({cell})"


@dg.asset(
    key=STUCK,
    group_name=ONCALL,  # the Catalog's first group: what on-call opens first
    description="Stuck in-flight jobs (the retries tab): past their stale threshold and not running as "
    "they should (the provider did not answer the last poll, not polled for two cadences or 2 min, within 2 "
    "attempts of the cap, not reached, an unusable result); a job whose last poll, on time, said it "
    "still runs is counted in running_fine, not listed. Each row: why, attempt n/max, next attempt, "
    "lease holder, the last reason. Act on one from the Launchpad with retry_job_now or "
    "fail_and_refund_job, or `recon-dagster retry|fail JOB_ID`.",
)
def stuck_jobs(context: dg.AssetExecutionContext, database: DatabaseResource) -> dg.MaterializeResult[Any]:
    meta = _read(database.get_engine(), context.op_execution_context)
    context.log.info(
        f"{meta['stuck']} stuck job(s), {meta['near_cap']} within 2 attempts of the cap; "
        f"{meta['running_fine']} past threshold running as they should"
    )
    return dg.MaterializeResult(metadata=meta)


class OperatorActionConfig(dg.Config):
    """One action on one job from the Launchpad. Dagster OSS has no users: nothing in a run says who
    launched it, so the operator says it here, and it is recorded with the action and this run."""

    job_id: str = Field(
        description="The app's jobs.id (a UUID). No default: the Launchpad keeps the last config launched "
        "from this browser, so check it names the job you mean."
    )
    operator: str = Field(
        description="Who acts: your name or handle, recorded with the action and this run's id "
        "(Dagster OSS has no users to say it for you)."
    )
    reason: str = Field(description="Why: recorded with the job and shown by explain. Required.")


def _who(context: dg.OpExecutionContext, config: OperatorActionConfig) -> str:
    """The operator as given, and the run that acted for them: "alice (Dagster run 1a2b3c4d)"."""
    operator = " ".join(config.operator.split())[:100]
    if not operator:
        raise dg.Failure(
            description="operator is required: the name of who acts, recorded with the action",
            allow_retries=False,
        )
    if not config.reason.strip():
        raise dg.Failure(description="reason is required: why, recorded with the job", allow_retries=False)
    return f"{operator} (Dagster run {context.run_id[:8]})"


def _act(
    context: dg.OpExecutionContext,
    config: OperatorActionConfig,
    act: Callable[[str], Done],
    engine: sa.Engine,
) -> dict[str, Any]:
    who = _who(context, config)
    try:
        done = act(who)
    except OperatorError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    # Visible on the Runs page: who acted on which job (the run has no user of its own).
    tags = {OPERATOR_TAG: config.operator.strip()[:100], ACTION_JOB_TAG: str(done.job_id)}
    try:
        context.instance.add_run_tags(context.run_id, tags)
    except Exception as exc:  # the action is done and recorded; a tag is a convenience
        context.log.warning(f"could not tag this run with {tags}: {exc}")
    context.log.info(f"{done.line} by {who}")
    record_stories(context, engine, [done.job_id])  # the action on the job's page at once
    return {"job_id": str(done.job_id), "result": done.line, "by": who}


@dg.op(out=dg.Out(dict))
def retry_now_op(
    context: dg.OpExecutionContext, config: OperatorActionConfig, database: DatabaseResource
) -> dict[str, Any]:
    """Make the job due now: the next sensor tick requests its attempt (counted as usual)."""
    engine = database.get_engine()
    return _act(
        context,
        config,
        lambda who: retry_now(engine, config.job_id, who=who, why=config.reason, run_id=context.run_id),
        engine,
    )


@dg.op(out=dg.Out(dict))
def fail_and_refund_now_op(
    context: dg.OpExecutionContext,
    config: OperatorActionConfig,
    database: DatabaseResource,
    providers: ProvidersResource,
) -> dict[str, Any]:
    """Fail the job and refund its credits (guarded: refused on a terminal job); its upstream task
    is cancelled where the provider can, else handed to the orphan sweep (the result says which)."""
    engine = database.get_engine()
    return _act(
        context,
        config,
        lambda who: fail_now(
            engine, config.job_id, who=who, reason=config.reason, run_id=context.run_id, providers=providers
        ),
        engine,
    )


@dg.job(
    executor_def=dg.in_process_executor,
    description="Retry one job now: set ops.retry_now_op.config job_id, operator (your name: Dagster OSS "
    "has no users) and reason. Its cadence wait is skipped; the attempt is counted as any other.",
    tags={ROLE_TAG: "operator"},
)
def retry_job_now() -> None:
    retry_now_op()


@dg.job(
    executor_def=dg.in_process_executor,
    description="Fail one in-flight job and refund its credits: set ops.fail_and_refund_now_op.config "
    "job_id, operator (your name: Dagster OSS has no users) and reason. The Launchpad keeps your last "
    "config: check the job id before you launch. Refused on a terminal job; recorded in "
    "reconcile_events with who, why and this run. Its upstream task is cancelled where the provider "
    "can, else handed to the orphan sweep (the run's result and the job's story say which).",
    tags={ROLE_TAG: "operator"},
)
def fail_and_refund_job() -> None:
    fail_and_refund_now_op()
