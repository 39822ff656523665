"""The per-provider not-found breaker: a burst of "not found" is a misconfiguration, not lost tasks.

A wrong token, account or base path makes every poll of one provider answer "not found"; failing
and refunding on each would wipe out every stale job of that provider in one tick. So every poll
answer is recorded per provider in PostgreSQL (``provider_poll_answers``, migration 139), where every
reconcile run (each its own process) sees the others' answers, and a not-found is judged against
the provider's recent answers (``decide.not_found_breaker_open``): while the breaker is open a
not-found only counts an attempt (the attempt cap still ends every job), with an ERROR log line and
the ``no_not_found_burst`` asset check failing.

Race bound: a not-found is committed before the window is counted (other answers may be held
back for a batch; that only makes the breaker stricter), and a count sees every answer
committed before it started, so the k-th not-found to commit always counts at least k. Only the
first ``burst`` not-founds of a burst can see a closed breaker, however many processes and threads
poll at once: with the default policy at most 5 jobs of a 500-job burst are failed and refunded.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from recon_dagster.kinds import get_kind
from recon_dagster.providers.status import (
    ProviderHTTPError,
    ProviderProtocolError,
    UpstreamState,
    UpstreamStatus,
)
from recon_dagster.reconcile.decide import BreakerPolicy, Decision, decide_on_status, not_found_breaker_open

log = logging.getLogger("recon_dagster.breaker")

BURST_ENV = "RECON_NOT_FOUND_BURST"
SHARE_ENV = "RECON_NOT_FOUND_SHARE"
WINDOW_ENV = "RECON_NOT_FOUND_WINDOW_S"

# One ERROR line per provider per process this often while its breaker is open; every held job
# still says why in its own reconcile_last_error and reconcile event.
LOUD_EVERY_S = 60.0

# Old rows deleted per recorded batch: enough to keep up with any poll rate, small enough that a
# record stays one short transaction.
PRUNE_BATCH = 500

# Answers other than not-found wait in the process for a batch: a transaction per poll cost about
# 6% of a backlog run's CPU. Holding them back can only raise the not-found share other processes
# see (a stricter breaker, never a looser one); a crash loses at most one batch of them.
FLUSH_EVERY = 50
FLUSH_AFTER_S = 1.0


def _env(environ: Mapping[str, str], name: str, default: float, cast: type, low: float, high: float) -> float:
    raw = environ.get(name, "").strip()
    try:
        value = cast(raw) if raw else default
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}, got {raw!r}")
    return value


def policy_from_env(environ: Mapping[str, str] | None = None) -> BreakerPolicy:
    """``RECON_NOT_FOUND_BURST`` (5), ``RECON_NOT_FOUND_SHARE`` (0.5), ``RECON_NOT_FOUND_WINDOW_S``
    (600); a malformed value is an error naming the variable."""
    env = os.environ if environ is None else environ
    d = BreakerPolicy()
    return BreakerPolicy(
        burst=int(_env(env, BURST_ENV, d.burst, int, 0, 1_000_000)),
        share=float(_env(env, SHARE_ENV, d.share, float, 0.0, 0.999)),
        window_s=float(_env(env, WINDOW_ENV, d.window_s, float, 1.0, 7 * 24 * 3600.0)),
    )


def provider_of(provider_kind: str) -> str:
    """The provider account a kind's polls go to (kie / replicate / elevenlabs)."""
    return get_kind(provider_kind).provider.value


def answered(exc: BaseException) -> bool:
    """Whether a failed poll still got an answer from the provider (an error status or a body we
    could not read), as opposed to no answer at all (connection refused, timeouts)."""
    if isinstance(exc, ProviderProtocolError):
        return True
    return isinstance(exc, ProviderHTTPError) and exc.status_code is not None


@dataclass(frozen=True)
class ProviderWindow:
    """One provider's answers within the breaker window."""

    provider: str
    not_found: int
    answers: int
    is_open: bool


def record_answer(
    conn: sa.Connection, provider: str, *, not_found: bool, window_s: float, count: int = 1
) -> None:
    """Record ``count`` answers of one kind and delete a batch of this provider's rows older than
    the window."""
    conn.execute(
        sa.text(
            "INSERT INTO provider_poll_answers (provider, not_found) "
            "SELECT :p, :nf FROM generate_series(1, :n)"
        ),
        {"p": provider, "nf": not_found, "n": count},
    )
    conn.execute(
        sa.text(
            """
            DELETE FROM provider_poll_answers WHERE id IN (
              SELECT id FROM provider_poll_answers
              WHERE provider = :p AND at < now() - make_interval(secs => :w)
              LIMIT :n FOR UPDATE SKIP LOCKED)
            """
        ),
        {"p": provider, "w": window_s, "n": PRUNE_BATCH},
    )


def window_counts(
    conn: sa.Connection, window_s: float, provider: str | None = None
) -> dict[str, tuple[int, int]]:
    """``{provider: (not_found, answers)}`` within the window, for one provider or all of them."""
    rows = conn.execute(
        sa.text(
            """
            SELECT provider, count(*) FILTER (WHERE not_found) AS nf, count(*) AS n
            FROM provider_poll_answers
            WHERE at >= now() - make_interval(secs => :w)
              AND (CAST(:p AS text) IS NULL OR provider = :p)
            GROUP BY provider
            """
        ),
        {"w": window_s, "p": provider},
    )
    return {r.provider: (int(r.nf), int(r.n)) for r in rows}


def provider_windows(conn: sa.Connection, policy: BreakerPolicy) -> list[ProviderWindow]:
    """Every provider with answers in the window, and whether its breaker is open."""
    return [
        ProviderWindow(p, nf, n, not_found_breaker_open(nf, n, policy))
        for p, (nf, n) in sorted(window_counts(conn, policy.window_s).items())
    ]


class NotFoundBreaker:
    """Records poll answers and judges them; one per Reconciler, safe to share between threads."""

    def __init__(self, engine: sa.Engine, policy: BreakerPolicy | None = None) -> None:
        self.engine = engine
        self.policy = policy or policy_from_env()
        self._loud_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._pending: Counter[str] = Counter()  # provider -> answers not written yet
        self._pending_since = 0.0

    def judge(self, status: UpstreamStatus) -> Decision:
        """Record the answer, then decide on it; a not-found is weighed against the window."""
        provider = provider_of(status.provider_kind)
        if status.state is not UpstreamState.NOT_FOUND:
            self._hold(provider)
            return decide_on_status(status)
        # This process's held answers first (the denominator), then the not-found, committed
        # before the count below: the ordering that bounds how many can slip through.
        self.flush()
        with self.engine.begin() as conn:
            record_answer(conn, provider, not_found=True, window_s=self.policy.window_s)
        with self.engine.connect() as conn:
            nf, n = window_counts(conn, self.policy.window_s, provider).get(provider, (1, 1))
        is_open = not_found_breaker_open(nf, n, self.policy)
        if is_open and self._time_to_be_loud(provider):
            log.error(
                "%s answered not-found %d times in %d answers within %gs: a burst like this is a wrong "
                "token, account or base path, not lost tasks; %s task %s is NOT failed, an attempt is "
                "counted instead (check the %s configuration; repeated at most every %gs)",
                provider, nf, n, self.policy.window_s, status.provider_kind, status.task_id, provider,
                LOUD_EVERY_S,
            )  # fmt: skip
        return decide_on_status(status, breaker_open=is_open)

    def _time_to_be_loud(self, provider: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._loud_at.get(provider, -LOUD_EVERY_S) < LOUD_EVERY_S:
                return False
            self._loud_at[provider] = now
            return True

    def record_error(self, provider_kind: str, exc: BaseException) -> None:
        """A failed poll that still got an answer counts among the provider's answers."""
        if answered(exc):
            self._hold(provider_of(provider_kind))

    def _hold(self, provider: str) -> None:
        now = time.monotonic()
        with self._lock:
            if not self._pending:
                self._pending_since = now
            self._pending[provider] += 1
            due = self._pending.total() >= FLUSH_EVERY or now - self._pending_since >= FLUSH_AFTER_S
        if due:
            self.flush()

    def flush(self) -> None:
        """Write the held answers (one statement per provider); the Reconciler calls this when
        a poll pass ends."""
        with self._lock:
            pending, self._pending = self._pending, Counter()
        if not pending:
            return
        try:
            with self.engine.begin() as conn:
                for provider, n in sorted(pending.items()):
                    record_answer(conn, provider, not_found=False, window_s=self.policy.window_s, count=n)
        except Exception:  # the denominator of a breaker must never turn an attempt into a crash
            log.exception("could not record %d poll answer(s)", pending.total())
