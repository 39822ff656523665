"""Find any job: one job's whole story (every attempt, the run that made it, what upstream said,
the outcome, credits, provider task id, assets) from the app database and the Dagster instance.

Used by the ``explain_job`` Dagster job (Launchpad) and ``recon-dagster explain JOB_ID``. The
queries are in ``load_story`` and ``resolve_run_ids``; everything else is pure formatting.

Run ids: each event records the run that made it (``reconcile_events.run_id``, migration 141);
an event written before that column existed is mapped through its ``run_key``: ``sweep:<run id>``
names the sweep run itself, and a sensor's run key is the run's ``dagster/run_key`` tag.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from recon_dagster.config import Settings, settings
from recon_dagster.core.runtags import RUN_KEY_TAG
from recon_dagster.db import ledger
from recon_dagster.db.jobs import readable, readable_ts, unreadable_columns
from recon_dagster.db.retention import Pruned, pruned_of
from recon_dagster.operator.actions import OPERATOR_OUTCOMES
from recon_dagster.reconcile.decide import Outcome, not_sent_reason

UI_URL_ENV = Settings.dagster_ui_url.name
DEFAULT_UI_URL = "http://127.0.0.1:3000"
SWEEP_OWNER_PREFIX = "sweep:"
_JOB_TIMES = ("created_at", "provider_call_started_at", "completed_at")


class ExplainError(ValueError):
    """A job id that is malformed or unknown; the message is one line an operator can act on."""


class JobNotFound(ExplainError):
    """A well-formed job id with no row in ``jobs``."""


@dataclass(frozen=True)
class Attempt:
    """One reconcile_events row: what one attempt did to the job, and which run did it."""

    at: datetime | None
    attempt: int
    outcome: str
    detail: str | None
    run_key: str | None
    duration_ms: int | None
    run_id: str | None = None

    @property
    def not_sent(self) -> bool:
        """A poll this process never sent (its account's limiter refused it): not an attempt."""
        return self.outcome == Outcome.NOT_SENT.value

    @property
    def by_operator(self) -> bool:
        """An operator's action (retry, fail, adopt, cancel): numbered apart, never an attempt."""
        return self.outcome in OPERATOR_OUTCOMES

    @property
    def counted(self) -> bool:
        """Whether this was an attempt: a poll never sent, a fault of ours and an operator's
        action are not."""
        return self.outcome not in (Outcome.NOT_SENT.value, Outcome.OUR_FAULT.value) and not self.by_operator

    @property
    def not_sent_reason(self) -> str | None:
        return not_sent_reason(self.detail) if self.not_sent else None


@dataclass(frozen=True)
class Credit:
    """The job's usage_logs row: reserved, committed or refunded, and from which pools."""

    status: str
    amount: float
    created_at: datetime | None
    settled_at: datetime | None
    pools: dict[str, Any]


@dataclass(frozen=True)
class Asset:
    asset_id: str
    asset_type: str
    storage_key: str
    url: str | None


@dataclass(frozen=True)
class Anomaly:
    reason: str
    amount: float | None
    at: datetime | None


@dataclass(frozen=True)
class CreateEntry:
    """One create the worker library sent for the job (the create ledger), and what became of it."""

    seq: int
    provider_kind: str
    intent_at: datetime | None
    state: str
    task_id: str | None
    fate: str | None
    fate_at: datetime | None
    detail: str

    def line(self, named: str | None) -> str:
        task = self.task_id or "no task id"
        if self.task_id and self.task_id == named:
            # A failed job's task is stopped upstream or followed by the sweep: say which.
            became = "the job's task" + (f", {self.fate}" if self.fate and self.fate != "attached" else "")
        else:
            became = self.fate or ("not judged yet" if self.task_id else "-")
        why = f" ({self.detail})" if self.detail and not self.task_id else ""
        return f"#{self.seq} {self.provider_kind} {_ts(self.intent_at)}: {self.state}{why}, {task}; {became}"


@dataclass(frozen=True)
class JobStory:
    job_id: str
    status: str
    job_type: str
    provider_kind: str | None
    provider_task_id: str | None
    progress: int
    created_at: datetime | None
    provider_call_started_at: datetime | None
    completed_at: datetime | None
    reconcile_attempts: int
    reconcile_last_error: str | None
    error_message: str | None
    lease_owner: str | None
    attempts: list[Attempt] = field(default_factory=list)
    credits: list[Credit] = field(default_factory=list)
    assets: list[Asset] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    # Job timestamps PostgreSQL holds and Python cannot (BC, after 9999, infinity): shown as "-".
    unreadable: tuple[str, ...] = ()
    # When the next attempt is due (None: due now) and until when lease_owner holds the job.
    next_attempt_at: datetime | None = None
    lease_expires_at: datetime | None = None
    # Every create sent for the job and every task id it returned (the create ledger).
    creates: list[CreateEntry] = field(default_factory=list)
    # What the retention schedule pruned of the job's history (recon_pruned_jobs), if anything.
    pruned: Pruned | None = None

    @property
    def outcome(self) -> str:
        """The job's end as an operator says it: the terminal status plus how credits settled."""
        credit = self.credits[0].status if self.credits else "no reservation"
        if self.status in ("pending", "processing"):
            return f"still {self.status} after {self.reconcile_attempts} attempt(s); credits {credit}"
        return f"{self.status}; credits {credit}"


# --- parsing and URLs (pure) --------------------------------------------------------------------


def parse_job_id(raw: str) -> uuid.UUID:
    """The job id as a UUID, or an ``ExplainError`` naming what was given."""
    text = (raw or "").strip()
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ExplainError(f"not a job id: {text!r} (a job id is a UUID such as 3f0c9a4e-...)") from None


def ui_base_url(default: str | None = DEFAULT_UI_URL) -> str | None:
    """``RECON_DAGSTER_UI_URL`` without a trailing slash; ``default`` when unset (None: relative)."""
    return settings().dagster_ui_url or default


def run_url(run_id: str, base: str | None) -> str:
    """The webserver page of a run (relative when there is no base URL, as inside the UI)."""
    return f"{base or ''}/runs/{run_id}"


# --- queries ------------------------------------------------------------------------------------


def load_story(engine: sa.Engine, job_id: uuid.UUID | str) -> JobStory:
    """Read the job row, its reconcile events, credits, assets and anomalies (one snapshot)."""
    jid = parse_job_id(str(job_id))
    with engine.connect() as conn:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        row = conn.execute(
            sa.text(
                f"""
                SELECT id, status, job_type, provider_kind, provider_task_id, progress,
                       {", ".join(readable_ts(c) for c in _JOB_TIMES)}, {unreadable_columns(_JOB_TIMES, "unreadable")},
                       reconcile_attempts, reconcile_last_error, error_message, reconcile_lease_owner,
                       CASE WHEN {readable("reconcile_next_at")} THEN reconcile_next_at END AS next_at,
                       CASE WHEN reconcile_lease_expires_at > now() AND {readable("reconcile_lease_expires_at")}
                            THEN reconcile_lease_expires_at END AS lease_until
                FROM jobs WHERE id = :j
                """
            ),
            {"j": str(jid)},
        ).first()
        if row is None:
            gone = pruned_of(conn, str(jid))
            if gone is not None:
                raise JobNotFound(
                    f"job {jid} is no longer in the jobs table; its history here: {gone.line()}"
                )
            raise JobNotFound(f"no job {jid} in the jobs table")
        events = conn.execute(
            sa.text(
                f"""
                SELECT {readable_ts("created_at")}, attempt, outcome, detail, run_key, duration_ms, run_id
                FROM reconcile_events WHERE job_id = :j ORDER BY created_at, id
                """
            ),
            {"j": str(jid)},
        ).all()
        usage = conn.execute(
            sa.text(
                f"SELECT status, amount, {readable_ts('created_at')}, {readable_ts('settled_at')}, metadata "
                "FROM usage_logs "
                "WHERE job_id = :j ORDER BY created_at"
            ),
            {"j": str(jid)},
        ).all()
        assets = conn.execute(
            sa.text(
                "SELECT id, asset_type, storage_key, url FROM assets WHERE job_id = :j ORDER BY created_at"
            ),
            {"j": str(jid)},
        ).all()
        anomalies = conn.execute(
            sa.text(
                f"SELECT reason, amount, {readable_ts('created_at')} FROM credit_anomalies WHERE job_id = :j "
                "ORDER BY id"
            ),
            {"j": str(jid)},
        ).all()
        creates = [
            CreateEntry(c.seq, c.provider_kind, c.intent_at, c.state, c.task_id, c.fate, c.fate_at, c.detail)
            for c in ledger.creates_of_job(conn, jid)
        ]
        pruned = pruned_of(conn, str(jid))
    return JobStory(
        pruned=pruned,
        creates=creates,
        job_id=str(row.id),
        status=row.status,
        job_type=row.job_type,
        provider_kind=row.provider_kind,
        provider_task_id=row.provider_task_id,
        progress=int(row.progress or 0),
        created_at=row.created_at,
        provider_call_started_at=row.provider_call_started_at,
        completed_at=row.completed_at,
        reconcile_attempts=int(row.reconcile_attempts),
        reconcile_last_error=row.reconcile_last_error,
        error_message=row.error_message,
        lease_owner=row.reconcile_lease_owner,
        unreadable=tuple(row.unreadable or ()),
        attempts=[
            Attempt(
                e.created_at,
                int(e.attempt),
                e.outcome,
                e.detail,
                e.run_key,
                e.duration_ms,
                str(e.run_id) if e.run_id is not None else None,
            )
            for e in events
        ],
        credits=[
            Credit(u.status, float(u.amount), u.created_at, u.settled_at, dict(u.metadata or {}))
            for u in usage
        ],
        assets=[Asset(str(a.id), a.asset_type, a.storage_key, a.url) for a in assets],
        anomalies=[
            Anomaly(a.reason, float(a.amount) if a.amount is not None else None, a.created_at)
            for a in anomalies
        ],
        next_attempt_at=row.next_at,
        lease_expires_at=row.lease_until,
    )


def resolve_run_ids(instance: Any, attempts: Iterable[Attempt]) -> dict[str, str]:
    """``run_key -> run id`` for the attempts that do not carry their run id.

    One run-storage query per distinct sensor run key (a job has at most a few dozen attempts).
    A key with no run (a purged run, an instance that is not the one that ran it) stays unmapped.
    """
    import dagster as dg

    out: dict[str, str] = {}
    for key in {a.run_key for a in attempts if a.run_id is None and a.run_key}:
        if key.startswith(SWEEP_OWNER_PREFIX):
            out[key] = key[len(SWEEP_OWNER_PREFIX) :]
            continue
        if instance is None:
            continue
        runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: key}), limit=1)
        if runs:
            out[key] = runs[0].run_id
    return out


def with_run_ids(story: JobStory, run_ids: Mapping[str, str]) -> JobStory:
    """The story with each attempt's run id filled from ``run_ids`` where it had none."""
    attempts = [
        replace(a, run_id=run_ids[a.run_key])
        if a.run_id is None and a.run_key and a.run_key in run_ids
        else a
        for a in story.attempts
    ]
    return replace(story, attempts=attempts)


def explain(engine: sa.Engine, instance: Any, job_id: uuid.UUID | str) -> JobStory:
    """The job's story with every attempt's run id resolved where the instance knows the run."""
    story = load_story(engine, job_id)
    return with_run_ids(story, resolve_run_ids(instance, story.attempts))


# --- formatting (pure) --------------------------------------------------------------------------


def _ts(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if value is not None else "-"


def _cell(text: Any) -> str:
    # Markdown table cells: one line, no column breaks.
    return str(text if text is not None else "-").replace("|", "\\|").replace("\n", " ")


def _credit_line(c: Credit) -> str:
    pools = ", ".join(f"{k} {v}" for k, v in sorted(c.pools.items())) or "pools not recorded"
    settled = f", settled {_ts(c.settled_at)}" if c.settled_at else ""
    return f"{c.amount:g} credits {c.status} ({pools}){settled}"


def facts(story: JobStory) -> list[tuple[str, str]]:
    """The job's headline facts, in the order an operator reads them."""
    return [
        ("job", story.job_id),
        ("outcome", story.outcome),
        ("status", f"{story.status} (progress {story.progress}%)"),
        ("job type", story.job_type),
        ("provider kind", story.provider_kind or "none (legacy row)"),
        ("provider task id", story.provider_task_id or "none"),
        ("created", _ts(story.created_at)),
        ("provider call started", _ts(story.provider_call_started_at)),
        ("completed", _ts(story.completed_at)),
        ("reconcile attempts", str(story.reconcile_attempts)),
        *_not_sent_facts(story),
        *_schedule_facts(story),
        ("upstream said last", story.reconcile_last_error or "-"),
        ("error message", story.error_message or "-"),
        ("credits", "; ".join(_credit_line(c) for c in story.credits) or "no reservation"),
        ("assets", "; ".join(f"{a.asset_type} {a.storage_key}" for a in story.assets) or "none"),
        ("credit anomalies", "; ".join(f"{a.reason} ({_ts(a.at)})" for a in story.anomalies) or "none"),
        ("upstream creates", _creates_fact(story)),
        *([("pruned history", story.pruned.line())] if story.pruned else []),
    ] + ([("unreadable timestamps", ", ".join(story.unreadable))] if story.unreadable else [])


def _creates_fact(story: JobStory) -> str:
    """The create ledger in one cell: every create, its task id, what became of it."""
    if not story.creates:
        return "none recorded"
    with_task = sum(1 for c in story.creates if c.task_id)
    head = f"{len(story.creates)} create(s), {with_task} task id(s)"
    if with_task > 1:
        head += " (more than one: the ones the row does not name are orphans)"
    return head


def create_lines(story: JobStory) -> list[str]:
    return [c.line(story.provider_task_id) for c in story.creates]


def _not_sent_facts(story: JobStory) -> list[tuple[str, str]]:
    """Polls the account's limiter never let out: how many, and the latest one's reason (while
    that is the job's latest event, it is why the job is waiting)."""
    unsent = [a for a in story.attempts if a.not_sent]
    if not unsent:
        return []
    last = unsent[-1]
    line = f"{len(unsent)} (no attempt counted); last {_ts(last.at)}: {last.not_sent_reason or '?'}"
    if story.attempts[-1] is last and story.status in ("pending", "processing"):
        line += ", rescheduled"
    return [("polls not sent", line)]


def _schedule_facts(story: JobStory) -> list[tuple[str, str]]:
    """What happens next to an in-flight job (attempts left, next attempt, lease), and the Runs
    page filter that finds every run that worked it (``recon_dagster.core.runtags``)."""
    from recon_dagster.core.kinds import MAX_ATTEMPTS
    from recon_dagster.core.runtags import job_tag

    key, value = job_tag(story.job_id)
    runs = ("runs filter", f"tag {key}={value}")
    if story.status not in ("pending", "processing"):
        return [runs]
    lease = "-"
    if story.lease_owner and story.lease_expires_at is not None:
        lease = f"{story.lease_owner} until {_ts(story.lease_expires_at)}"
    return [
        ("attempts left", f"{max(MAX_ATTEMPTS - story.reconcile_attempts, 0)} of {MAX_ATTEMPTS}"),
        (
            "next attempt",
            _ts(story.next_attempt_at) if story.next_attempt_at else "due now (once past its threshold)",
        ),
        ("lease", lease),
        runs,
    ]


def runs_in_order(story: JobStory) -> list[tuple[str, str]]:
    """``(label, run id)`` of every run that worked the job, the first one first: "run 1 (attempt
    1)", "run 2 (attempts 2-3)"... (numbered by when each run first acted, never by its id)."""
    seen: dict[str, list[int]] = {}
    for a in sorted(story.attempts, key=lambda a: (a.at is None, a.at or datetime.min)):
        if a.run_id:
            seen.setdefault(a.run_id, []).append(a.attempt)
    out = []
    width = len(str(len(seen)))
    for i, (run_id, attempts) in enumerate(seen.items(), start=1):
        numbers = sorted({n for n in attempts if n > 0})
        if not numbers:
            which = "no attempt"
        elif len(numbers) == 1:
            which = f"attempt {numbers[0]}"
        else:
            which = f"attempts {numbers[0]}-{numbers[-1]}"
        out.append((f"run {i:0{width}d} ({which})", run_id))
    return out


def _no_attempts(story: JobStory) -> str:
    """No attempt row left: pruned past its retention (say so), or never reconciled."""
    if story.pruned and story.pruned.events:
        return f"{story.pruned.events} pruned (see pruned history)"
    return "never reconciled"


def numbers(story: JobStory) -> list[str]:
    """Each story row's number: its attempt (``#n``: what the cap counts), ``op n`` for the n-th
    operator action, ``#-`` for a poll never sent or a fault of ours (neither is an attempt)."""
    out, ops = [], 0
    for a in story.attempts:
        if a.by_operator:
            ops += 1
            out.append(f"op {ops}")
        else:
            out.append(f"#{a.attempt}" if a.counted else "#-")
    return out


def to_markdown(story: JobStory, base_url: str | None) -> str:
    """The story as two markdown tables: facts, then one row per attempt with its run link."""
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in facts(story)]
    lines += ["", "| when | attempt | outcome | what upstream said | run |", "|---|---:|---|---|---|"]
    for a, number in zip(story.attempts, numbers(story), strict=True):
        run = f"[{a.run_id[:8]}]({run_url(a.run_id, base_url)})" if a.run_id else _cell(a.run_key)
        lines.append(f"| {_ts(a.at)} | {number} | {a.outcome} | {_cell(a.detail)} | {run} |")
    if not story.attempts:
        lines.append(f"| - | - | {_no_attempts(story)} | - | - |")
    if story.creates:
        lines += ["", "| upstream creates (the create ledger) |", "|---|"]
        lines += [f"| {_cell(line)} |" for line in create_lines(story)]
    return "\n".join(lines)


def to_text(story: JobStory, base_url: str | None) -> str:
    """The story for a terminal: aligned facts, then one line per attempt with its run URL."""
    width = max(len(k) for k, _ in facts(story))
    out = [f"{k:<{width}}  {v}" for k, v in facts(story)]
    out.append("")
    unsent = sum(a.not_sent for a in story.attempts)
    operator = sum(a.by_operator for a in story.attempts)
    ours = sum(not a.counted and not a.not_sent and not a.by_operator for a in story.attempts)
    counted = (
        f"{len(story.attempts) - unsent - ours - operator}"
        + (f", and {unsent} poll(s) not sent" if unsent else "")
        + (f", and {ours} stopped by a fault of ours (not counted)" if ours else "")
        + (f", and {operator} operator action(s), numbered op 1, op 2..." if operator else "")
    )
    out.append(f"attempts ({counted}):" if story.attempts else f"attempts: {_no_attempts(story)}")
    for a, number in zip(story.attempts, numbers(story), strict=True):
        run = run_url(a.run_id, base_url) if a.run_id else f"run key {a.run_key} (run not found)"
        out.append(f"  {_ts(a.at)}  {number:<4} {a.outcome:<13} {a.detail or '-'}")
        out.append(f"  {'':19}        run: {run}")
    if story.creates:
        out += ["", "upstream creates (the create ledger):", *(f"  {line}" for line in create_lines(story))]
    return "\n".join(out)


def to_json(story: JobStory, base_url: str | None) -> dict[str, Any]:
    """The story as JSON-ready data, every attempt with its run URL (null when unknown)."""
    data = asdict(story)
    data["outcome"] = story.outcome
    for a, raw, number in zip(story.attempts, data["attempts"], numbers(story), strict=True):
        raw["run_url"] = run_url(a.run_id, base_url) if a.run_id else None
        raw["counted"] = a.counted
        raw["operator_action"] = a.by_operator
        raw["number"] = number
        raw["not_sent_reason"] = a.not_sent_reason
    jsonable: dict[str, Any] = _jsonable(data)
    return jsonable


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


# --- the CLI's entry point ------------------------------------------------------------------------


def explain_command(raw_job_id: str, *, as_json: bool = False) -> int:
    """``recon-dagster explain JOB_ID [--json]``: print the story; a bad or unknown id is one line
    on stderr (exit 2 for a malformed id, 1 for an unknown one)."""
    import json
    import sys

    from recon_dagster.db.engine import get_engine

    try:
        job_id = parse_job_id(raw_job_id)
        with _instance_or_none() as instance:
            story = explain(get_engine(), instance, job_id)
    except ExplainError as exc:
        print(f"recon-dagster explain: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, JobNotFound) else 2
    base = ui_base_url()
    print(json.dumps(to_json(story, base), indent=2) if as_json else to_text(story, base))
    return 0


def _instance_or_none() -> Any:
    """The Dagster instance whose runs hold the run keys: ``DAGSTER_HOME``, else the project-local
    one ``recon-dagster dev`` / ``demo`` use when it exists, else none (run ids then come only from
    the events themselves)."""
    import contextlib
    from pathlib import Path

    import dagster as dg

    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    local = Path.cwd() / ".recon" / "dagster_home"
    if (local / "dagster.yaml").is_file():
        from recon_dagster.db.engine import resolve_database_url
        from recon_dagster.operator.instance import prepare_dagster_home

        os.environ.update(prepare_dagster_home(local, resolve_database_url()))
        return dg.DagsterInstance.get()
    return contextlib.nullcontext(None)
