"""Which provider is down: each provider judged by what it answers now, over distinct jobs.

Every job polled within the window (``RECON_HEALTH_WINDOW_S``, 30 minutes) counts once, by its
latest poll: answered (any state: running, succeeded, failed, not found) or not (a 5xx, a 429, a
timeout, a refused connection, a rejected key). A job that ended (completed, force-failed,
cancelled) counts only if that poll was answered: its unanswered polls are history, not what the
provider says now, so an outage's force-failed jobs never page again after the recovery.

- **DOWN** when at least ``RECON_HEALTH_MIN_JOBS`` (3) of those jobs got no answer and they are
  more than ``RECON_HEALTH_DOWN_SHARE`` (half) of them: the check fails at ERROR severity;
- **DEGRADED** when not down but at least ``RECON_HEALTH_DEGRADED_MIN_JOBS`` (2) got no answer and
  they are at least ``RECON_HEALTH_DEGRADED_SHARE`` (a fifth) of them: the check fails at WARN
  severity (an alert of severity ``warning`` with ``RECON_ALERT_MIN_SEVERITY=warn``; by default a
  DOWN provider turning DEGRADED resolves its page with the line saying what still fails);
- **IDLE** when no job of it is judged (none in flight polled in the window, none answered);
  **healthy** otherwise.

Slow is shown, never judged: the 90th percentile of its answered polls' latency in the window
(``slow`` from ``RECON_HEALTH_SLOW_POLL_S``) and its oldest job in flight, per provider.

A job's own bad result (unusable media, another task's result, an answer unreadable for that job) and our own errors are not answers of the provider
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
    DEGRADED = "degraded"
    HEALTHY = "healthy"
    IDLE = "idle"
    # Its key is not set here: never polled, so never judged (its one line says what to set).
    NOT_CONFIGURED = "not_configured"


@dataclass(frozen=True)
class HealthPolicy:
    window_s: float = 1800.0
    min_jobs: int = 3
    down_share: float = 0.5
    degraded_min_jobs: int = 2
    degraded_share: float = 0.2
    slow_poll_s: float = 10.0

    @classmethod
    def from_config(cls, environ: Mapping[str, str] | None = None) -> HealthPolicy:
        now = settings(environ)
        return cls(
            window_s=now.health_window_s,
            min_jobs=now.health_min_jobs,
            down_share=now.health_down_share,
            degraded_min_jobs=now.health_degraded_min_jobs,
            degraded_share=now.health_degraded_share,
            slow_poll_s=now.health_slow_poll_s,
        )

    @property
    def window(self) -> str:
        minutes = self.window_s / 60
        return f"{minutes:g} min" if minutes >= 1 else f"{self.window_s:g} s"


@dataclass
class ProviderFigures:
    """One provider's judged jobs polled in the window, each by its latest poll (and the jobs
    whose own result failed them, which are shown but never judged), with how slow it answers."""

    provider: str
    jobs: int = 0
    unanswered: int = 0
    own_errors: int = 0
    last_reason: str | None = None  # the latest unanswered poll's reason
    last_reason_at: datetime | None = None
    kinds: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (jobs, unanswered)
    slow_poll_ms: int | None = None  # 90th percentile of its answered polls' latency in the window
    oldest_s: float | None = None  # age of its oldest judged job in flight (since it was created)


@dataclass(frozen=True)
class Verdict:
    provider: str
    state: State
    line: str
    figures: ProviderFigures

    @property
    def passed(self) -> bool:
        return self.state in (State.HEALTHY, State.IDLE, State.NOT_CONFIGURED)


# Each job's latest poll in the window among the rows health reads (the (outcome, cause) pairs of
# reconcile.cause), of jobs still in flight or answered (a job that ended is judged only by an
# answer it got); then per kind: jobs, unanswered jobs, the latest unanswered reason and the oldest
# job in flight's age.
_JUDGED = sql(
    """
    WITH counted AS (
      SELECT p.outcome, p.cause, p.answered
      FROM unnest(CAST(:outcomes AS text[]), CAST(:causes AS text[]), CAST(:answered AS boolean[]))
        AS p(outcome, cause, answered)
    ), latest AS (
      SELECT DISTINCT ON (e.job_id) e.provider_kind, e.created_at, e.detail, c.answered,
             j.created_at AS job_created_at, coalesce(j.status IN ('pending', 'processing'), false) AS inflight
      FROM reconcile_events e JOIN counted c ON c.outcome = e.outcome AND c.cause = e.cause
        LEFT JOIN jobs j ON j.id = e.job_id
      WHERE e.created_at > now() - make_interval(secs => :window_s) AND e.provider_kind IS NOT NULL
      ORDER BY e.job_id, e.created_at DESC, e.id DESC
    )
    SELECT provider_kind, count(*) AS jobs, count(*) FILTER (WHERE NOT answered) AS unanswered,
           (array_agg(detail ORDER BY created_at DESC) FILTER (WHERE NOT answered))[1] AS last_reason,
           max(created_at) FILTER (WHERE NOT answered) AS last_reason_at,
           extract(epoch FROM now() - min(job_created_at) FILTER (WHERE inflight)) AS oldest_s
    FROM latest WHERE inflight OR answered GROUP BY provider_kind
    """
)

# How long its answers take: the 90th percentile of every answered poll's latency in the window.
_LATENCY = sql(
    """
    SELECT provider_kind, percentile_disc(0.9) WITHIN GROUP (ORDER BY duration_ms) AS p90_ms
    FROM reconcile_events
    WHERE created_at > now() - make_interval(secs => :window_s) AND provider_kind IS NOT NULL
      AND cause = 'answered' AND duration_ms IS NOT NULL
    GROUP BY provider_kind
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
        if r.oldest_s is not None:
            f.oldest_s = max(f.oldest_s or 0.0, float(r.oldest_s))
    for r in conn.execute(_LATENCY, {"window_s": window_s}):
        kind = KINDS.get(r.provider_kind)
        if kind is not None and r.p90_ms is not None:
            f = out[kind.provider]
            f.slow_poll_ms = max(f.slow_poll_ms or 0, int(r.p90_ms))
    for r in conn.execute(_OWN_ERRORS, {"window_s": window_s}):
        kind = KINDS.get(r.provider_kind)
        if kind is not None:
            out[kind.provider].own_errors += int(r.jobs)
    return out


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def slowness(f: ProviderFigures, policy: HealthPolicy) -> str:
    """ "slow: answers take 12 s (p90)" when its answered polls are slow, else "" (pure)."""
    if f.slow_poll_ms is None or f.slow_poll_ms < policy.slow_poll_s * 1000:
        return ""
    oldest = f"; oldest job in flight {_duration(f.oldest_s)}" if f.oldest_s else ""
    return f"slow: answers take {_duration(f.slow_poll_ms / 1000)} (p90){oldest}"


def judge(f: ProviderFigures, policy: HealthPolicy) -> Verdict:
    """The provider's state and the one line the console and the alerts show (pure)."""
    own = f"; {f.own_errors} job(s) failed by their own result, not counted" if f.own_errors else ""
    if f.jobs == 0:
        return Verdict(
            f.provider,
            State.IDLE,
            f"{f.provider} idle: no job of it in flight polled in the last {policy.window}{own}",
            f,
        )
    down = f.unanswered >= policy.min_jobs and f.unanswered > policy.down_share * f.jobs
    degraded = (
        not down
        and f.unanswered >= policy.degraded_min_jobs
        and f.unanswered >= policy.degraded_share * f.jobs
    )
    state = State.DOWN if down else State.DEGRADED if degraded else State.HEALTHY
    share = f"{f.unanswered / f.jobs:.0%}"
    shown = "healthy" if state is State.HEALTHY else state.value.upper()
    line = (
        f"{f.provider} {shown}: {f.unanswered} of {f.jobs} job(s) got no answer "
        f"({share}) in the last {policy.window}"
    )
    if state is not State.HEALTHY and f.last_reason:
        line += f"; last: {short_reason(f.last_reason, 240)}"
    elif f.unanswered and f.unanswered < policy.degraded_min_jobs:
        line += f" (DEGRADED from {policy.degraded_min_jobs} jobs)"
    slow = slowness(f, policy)
    return Verdict(f.provider, state, line + (f"; {slow}" if slow else "") + own, f)


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
