"""Which provider is down: each provider judged by its answers to polls over distinct jobs.

Every job polled within the window (``RECON_HEALTH_WINDOW_S``, 30 minutes) counts once, by its
latest poll: answered (any state: running, succeeded, failed, not found) or not (a 5xx, a 429, a
timeout, a refused connection, a rejected key). A provider is DOWN when at least
``RECON_HEALTH_MIN_JOBS`` (3) distinct jobs got no answer and they are more than
``RECON_HEALTH_DOWN_SHARE`` (half) of the jobs it was asked about; IDLE when no job of it was
polled in the window; healthy otherwise. A job's own bad result (unusable media, another task's
result, an answer unreadable for that job) and our own errors are not answers of the provider
(``recon_dagster.reconcile.cause``): two jobs whose media is text where an image was promised,
retried at every cadence, never make KIE look down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa

from recon_dagster.config import settings
from recon_dagster.core.kinds import KINDS, provider_names
from recon_dagster.core.text import short_reason
from recon_dagster.db.sqltext import sql
from recon_dagster.providers.resource import not_configured, not_configured_line
from recon_dagster.reconcile.cause import health_pairs


class State(StrEnum):
    DOWN = "down"
    HEALTHY = "healthy"
    IDLE = "idle"
    # Its key is not set here: never polled, so never judged (its one line says what to set).
    NOT_CONFIGURED = "not_configured"


@dataclass(frozen=True)
class HealthPolicy:
    window_s: float = 1800.0
    min_jobs: int = 3
    down_share: float = 0.5

    @classmethod
    def from_config(cls, environ: Mapping[str, str] | None = None) -> HealthPolicy:
        now = settings(environ)
        return cls(
            window_s=now.health_window_s, min_jobs=now.health_min_jobs, down_share=now.health_down_share
        )

    @property
    def window(self) -> str:
        minutes = self.window_s / 60
        return f"{minutes:g} min" if minutes >= 1 else f"{self.window_s:g} s"


@dataclass
class ProviderFigures:
    """One provider's jobs in the window, each by its latest poll (and the jobs whose own result
    failed them, which are shown but never judged)."""

    provider: str
    jobs: int = 0
    unanswered: int = 0
    own_errors: int = 0
    last_reason: str | None = None  # the latest unanswered poll's reason
    last_reason_at: datetime | None = None
    kinds: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (jobs, unanswered)


@dataclass(frozen=True)
class Verdict:
    provider: str
    state: State
    line: str
    figures: ProviderFigures

    @property
    def passed(self) -> bool:
        return self.state is not State.DOWN


# Each job's latest poll in the window among the rows health reads (the (outcome, cause) pairs of
# reconcile.cause); then per kind: jobs, unanswered jobs and the latest unanswered reason.
_JUDGED = sql(
    """
    WITH counted AS (
      SELECT p.outcome, p.cause, p.answered
      FROM unnest(CAST(:outcomes AS text[]), CAST(:causes AS text[]), CAST(:answered AS boolean[]))
        AS p(outcome, cause, answered)
    ), latest AS (
      SELECT DISTINCT ON (e.job_id) e.provider_kind, e.created_at, e.detail, c.answered
      FROM reconcile_events e JOIN counted c ON c.outcome = e.outcome AND c.cause = e.cause
      WHERE e.created_at > now() - make_interval(secs => :window_s) AND e.provider_kind IS NOT NULL
      ORDER BY e.job_id, e.created_at DESC, e.id DESC
    )
    SELECT provider_kind, count(*) AS jobs, count(*) FILTER (WHERE NOT answered) AS unanswered,
           (array_agg(detail ORDER BY created_at DESC) FILTER (WHERE NOT answered))[1] AS last_reason,
           max(created_at) FILTER (WHERE NOT answered) AS last_reason_at
    FROM latest GROUP BY provider_kind
    """
)

# Jobs whose own result failed an attempt in the window (shown next to the verdict, never in it).
_OWN_ERRORS = sql(
    """
    SELECT provider_kind, count(DISTINCT job_id) AS jobs FROM reconcile_events
    WHERE created_at > now() - make_interval(secs => :window_s) AND cause = 'job'
      AND provider_kind IS NOT NULL
    GROUP BY provider_kind
    """
)


def provider_figures(conn: sa.Connection, window_s: float) -> dict[str, ProviderFigures]:
    """Every provider's figures over the last ``window_s`` seconds (zeros for a silent one)."""
    pairs = health_pairs()
    out = {p: ProviderFigures(p) for p in provider_names()}
    rows = conn.execute(
        _JUDGED,
        {
            "outcomes": [o for o, _, _ in pairs],
            "causes": [c for _, c, _ in pairs],
            "answered": [a for _, _, a in pairs],
            "window_s": window_s,
        },
    )
    for r in rows:
        kind = KINDS.get(r.provider_kind)
        if kind is None:
            continue
        f = out[kind.provider]
        f.jobs += int(r.jobs)
        f.unanswered += int(r.unanswered)
        f.kinds[r.provider_kind] = (int(r.jobs), int(r.unanswered))
        if r.last_reason_at is not None and (f.last_reason_at is None or r.last_reason_at > f.last_reason_at):
            f.last_reason, f.last_reason_at = r.last_reason, r.last_reason_at
    for r in conn.execute(_OWN_ERRORS, {"window_s": window_s}):
        kind = KINDS.get(r.provider_kind)
        if kind is not None:
            out[kind.provider].own_errors += int(r.jobs)
    return out


def judge(f: ProviderFigures, policy: HealthPolicy) -> Verdict:
    """The provider's state and the one line the console and the alerts show (pure)."""
    own = f"; {f.own_errors} job(s) failed by their own result, not counted" if f.own_errors else ""
    if f.jobs == 0:
        return Verdict(
            f.provider,
            State.IDLE,
            f"{f.provider} idle: no job of it polled in the last {policy.window}{own}",
            f,
        )
    down = f.unanswered >= policy.min_jobs and f.unanswered > policy.down_share * f.jobs
    state = State.DOWN if down else State.HEALTHY
    share = f"{f.unanswered / f.jobs:.0%}"
    line = (
        f"{f.provider} {'DOWN' if down else 'healthy'}: {f.unanswered} of {f.jobs} job(s) got no answer "
        f"({share}) in the last {policy.window}"
    )
    if down and f.last_reason:
        line += f"; last: {short_reason(f.last_reason, 240)}"
    elif f.unanswered and not down and f.unanswered < policy.min_jobs:
        line += f" (DOWN from {policy.min_jobs} jobs)"
    return Verdict(f.provider, state, line + own, f)


def verdicts(conn: sa.Connection, policy: HealthPolicy) -> list[Verdict]:
    """Every provider's verdict, in the registry's order."""
    figures = provider_figures(conn, policy.window_s)
    missing = set(not_configured())
    return [
        Verdict(p, State.NOT_CONFIGURED, not_configured_line(p), figures[p])
        if p in missing
        else judge(figures[p], policy)
        for p in provider_names()
    ]
