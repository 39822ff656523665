"""The not-found breaker: a burst of "not found" is a misconfiguration, not lost tasks.

A wrong token, account or base path makes every poll of one provider answer "not found"; failing
and refunding on each would wipe out every stale job of that provider in one tick. So every poll
answer is recorded per provider and kind in PostgreSQL (``provider_poll_answers``, migrations 139
and 142), where every reconcile run (each its own process) sees the others' answers, and a
not-found is judged against two windows (``decide.not_found_breaker_open``): its kind's answers,
and its provider's. The breaker is open for a kind when either is: per kind, because one kind's
endpoint can be wrong while its siblings answer (40 running predictions must not dilute 15
trainings answering 404); per provider, because a wrong token fails every kind of it at once. While
it is open a not-found only counts an attempt (the attempt cap still ends every job), with an ERROR
log line and the ``no_not_found_burst`` asset check failing.

Race bound: a not-found is committed before the windows are counted (other answers may be held
back for a batch; that only makes the breaker stricter), and a count sees every answer committed
before it started, so the k-th not-found of a kind to commit always counts at least k in its kind's
window. Only the first ``burst`` not-founds of a kind can see a closed breaker, however many
processes and threads poll at once and whatever the provider's other traffic: with the default
policy at most 5 jobs of a kind are failed and refunded per burst.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from recon_dagster.core.kinds import get_kind
from recon_dagster.db.sqltext import sql
from recon_dagster.providers.status import (
    ProviderHTTPError,
    ProviderProtocolError,
    UpstreamState,
    UpstreamStatus,
)
from recon_dagster.reconcile.decide import BreakerPolicy, Decision, decide_on_status, not_found_breaker_open

log = logging.getLogger("recon_dagster.reconcile.breaker")

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


def provider_of(provider_kind: str) -> str:
    """The provider account a kind's polls go to (the registry's provider of the kind)."""
    return get_kind(provider_kind).provider


def answered(exc: BaseException) -> bool:
    """Whether a failed poll still got an answer from the provider (an error status or a body we
    could not read), as opposed to no answer at all (connection refused, timeouts)."""
    if isinstance(exc, ProviderProtocolError):
        return True
    return isinstance(exc, ProviderHTTPError) and exc.status_code is not None


@dataclass(frozen=True)
class ProviderWindow:
    """Answers within the breaker window: of one provider's kind, or (``kind`` None) of the
    provider as a whole."""

    provider: str
    not_found: int
    answers: int
    is_open: bool
    kind: str | None = None

    @property
    def name(self) -> str:
        return self.kind or self.provider


def record_answer(
    conn: sa.Connection,
    provider: str,
    *,
    not_found: bool,
    window_s: float,
    count: int = 1,
    kind: str | None = None,
) -> None:
    """Record ``count`` answers of one provider kind and delete a batch of this provider's rows
    older than the window."""
    record_answers(conn, provider, {kind: count}, not_found=not_found, window_s=window_s)


def record_answers(
    conn: sa.Connection, provider: str, counts: Mapping[str | None, int], *, not_found: bool, window_s: float
) -> None:
    """Record answers of one provider, ``{kind: count}``, in one statement, and prune its rows
    older than the window."""
    kinds = sorted(counts, key=str)
    conn.execute(
        sql(
            "INSERT INTO provider_poll_answers (provider, provider_kind, not_found) "
            "SELECT :p, k.kind, :nf FROM unnest(CAST(:kinds AS text[]), CAST(:ns AS int[])) AS k(kind, n), "
            "generate_series(1, k.n)"
        ),
        {"p": provider, "nf": not_found, "kinds": kinds, "ns": [counts[k] for k in kinds]},
    )
    conn.execute(
        sql(
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
) -> dict[tuple[str, str | None], tuple[int, int]]:
    """``{(provider, kind): (not_found, answers)}`` within the window, for one provider or all of
    them; ``(provider, None)`` holds the provider's totals (every kind, and rows from before
    migration 142, which have no kind)."""
    rows = conn.execute(
        sql(
            """
            SELECT provider, provider_kind, GROUPING(provider_kind) = 1 AS total,
                   count(*) FILTER (WHERE not_found) AS nf, count(*) AS n
            FROM provider_poll_answers
            WHERE at >= now() - make_interval(secs => :w)
              AND (CAST(:p AS text) IS NULL OR provider = :p)
            GROUP BY GROUPING SETS ((provider, provider_kind), (provider))
            """
        ),
        {"w": window_s, "p": provider},
    )
    # Rows from before migration 142 have no kind: they count in their provider's totals only.
    return {
        (r.provider, None if r.total else r.provider_kind): (int(r.nf), int(r.n))
        for r in rows
        if r.total or r.provider_kind is not None
    }


def provider_windows(conn: sa.Connection, policy: BreakerPolicy) -> list[ProviderWindow]:
    """Every provider, and every kind, with answers in the window (a provider's own window first),
    each with whether its breaker is open by its own counts."""
    return [
        ProviderWindow(p, nf, n, not_found_breaker_open(nf, n, policy), kind)
        for (p, kind), (nf, n) in sorted(window_counts(conn, policy.window_s).items(), key=_window_order)
    ]


def _window_order(item: tuple[tuple[str, str | None], tuple[int, int]]) -> tuple[str, str]:
    (provider, kind), _ = item
    return provider, kind or ""


class NotFoundBreaker:
    """Records poll answers and judges them; one per Reconciler, safe to share between threads."""

    def __init__(self, engine: sa.Engine, policy: BreakerPolicy | None = None) -> None:
        self.engine = engine
        # The configured policy is passed in by the definitions (defs/settings_check.py); the
        # domain reads no settings itself.
        self.policy = policy or BreakerPolicy()
        self._loud_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._pending: Counter[tuple[str, str]] = Counter()  # (provider, kind) -> answers not written yet
        self._pending_since = 0.0

    def judge(self, status: UpstreamStatus) -> Decision:
        """Record the answer, then decide on it; a not-found is weighed against its kind's window
        and its provider's."""
        kind = status.provider_kind
        provider = provider_of(kind)
        if status.state is not UpstreamState.NOT_FOUND:
            self._hold(provider, kind)
            return decide_on_status(status)
        # This process's held answers first (the denominator), then the not-found, committed
        # before the count below: the ordering that bounds how many can slip through.
        self.flush()
        with self.engine.begin() as conn:
            record_answer(conn, provider, not_found=True, window_s=self.policy.window_s, kind=kind)
        with self.engine.connect() as conn:
            counts = window_counts(conn, self.policy.window_s, provider)
        open_by = [
            (name, nf, n)
            for name, (nf, n) in ((kind, counts.get((provider, kind), (1, 1))),
                                  (provider, counts.get((provider, None), (1, 1))))
            if not_found_breaker_open(nf, n, self.policy)
        ]  # fmt: skip
        if open_by and self._time_to_be_loud(kind):
            name, nf, n = open_by[0]
            log.error(
                "%s answered not-found %d times in %d answers within %gs: a burst like this is a wrong "
                "token, account, endpoint or base path, not lost tasks; %s task %s is NOT failed, an "
                "attempt is counted instead (check the %s configuration; repeated at most every %gs)",
                name, nf, n, self.policy.window_s, kind, status.task_id, provider, LOUD_EVERY_S,
            )  # fmt: skip
        return decide_on_status(status, breaker_open=bool(open_by))

    def _time_to_be_loud(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._loud_at.get(key, -LOUD_EVERY_S) < LOUD_EVERY_S:
                return False
            self._loud_at[key] = now
            return True

    def record_error(self, provider_kind: str, exc: BaseException) -> None:
        """A failed poll that still got an answer counts among its kind's and provider's answers."""
        if answered(exc):
            self._hold(provider_of(provider_kind), provider_kind)

    def _hold(self, provider: str, kind: str) -> None:
        now = time.monotonic()
        with self._lock:
            if not self._pending:
                self._pending_since = now
            self._pending[(provider, kind)] += 1
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
        by_provider: dict[str, dict[str | None, int]] = {}
        for (provider, kind), n in pending.items():
            by_provider.setdefault(provider, {})[kind] = n
        try:
            with self.engine.begin() as conn:
                for provider, counts in sorted(by_provider.items()):
                    record_answers(conn, provider, counts, not_found=False, window_s=self.policy.window_s)
        except Exception:  # the denominator of a breaker must never turn an attempt into a crash
            log.exception("could not record %d poll answer(s)", pending.total())
