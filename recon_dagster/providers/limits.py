"""Provider account limits shared by every process and host, kept in the app's PostgreSQL.

A provider limits its account (its API key), not a process: each Dagster run is a process, and
several run at once, so a per-process bucket lets the account see several times its budget. Here
every process draws on one budget per account (migration 140):

- **rate**: a token bucket per account and request class (``read``, ``create``) in one row;
  a caller reserves its token with one ``UPDATE ... RETURNING`` (the balance may go negative) and
  sleeps until the token exists, so callers are served in reservation order across processes;
  at high rates one statement reserves the next ~50 ms of tokens for the process (``chunk_size``);
- **concurrency**: a slot table; a request holds a slot for its duration, with an expiry so a
  killed process frees its slots; a kind may hold at most ``kind_share`` of the slots while
  others want them, so one kind's backlog cannot starve another kind of the same provider;
- **Retry-After**: a 429 with ``Retry-After`` blocks the account for everyone: ``blocked_until``
  on the account row, and every bucket of the account empties and refills from then on (another
  process may still spend the tokens it reserved before the block that are due already: at most
  one chunk, 1 at the documented polling rates; a request still sleeping for its token when the
  block comes wakes to it, gives its token back and queues again behind the block).

Budgets come from ``RECON_LIMIT_<PROVIDER>`` (``limit_config.parse_account_limits``), with defaults per provider
from their documented limits. The per-process limiter in ``http.py`` stays as a fast path and is
the fallback when no account is configured (``RECON_LIMITS=process``, or a resource built by hand,
e.g. in unit tests) or the tables cannot be reached (logged).
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from recon_dagster.config import Settings, limit_name
from recon_dagster.core.deadlines import stale_part_age_s
from recon_dagster.db import contract
from recon_dagster.db.engine import DatabaseUnavailable, get_engine
from recon_dagster.providers.limit_config import (
    BATCH_POLL_WINDOW_S,
    DEFAULT_LIMITS,
    LIMITS_MODE_ENV,
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_WINDOW_S,
    MIGRATE_ENV,
    MIN_WINDOW_S,
    AccountLimits,
    Budget,
    LimitsConfigError,
    RunShape,
    _as_budget,
    _describe_bucket,
    account_limits_from_env,
    batch_sizes_within_budgets,
    budget_migration_requested,
    parse_account_limits,
    poll_budgets,
    polls_per_cadence,
    resource_limit_fields,
    run_shape,
    shared_limits_enabled,
)
from recon_dagster.providers.limit_slots import SlotRenewer
from recon_dagster.providers.status import NotSent, NotSentReason

_DB_ERRORS = (sa.exc.SQLAlchemyError, DatabaseUnavailable)

log = logging.getLogger("recon_dagster.providers.limits")


class TokenWaitTooLong(NotSent):
    """The account's next token comes after the request's deadline or the run's lease: the request
    is not sent (and takes no token) instead of sleeping past them. ``retry_in_s``: when the next
    token comes; the reason is ``limiter_refused`` when a Retry-After block is what holds it."""

    def __init__(
        self,
        kind: str,
        _status: object,
        message: str,
        retry_in_s: float | None = None,
        reason: NotSentReason = NotSentReason.TOKEN_WAIT,
    ) -> None:
        super().__init__(kind, reason, message, retry_in_s)


class AccountBusy(NotSent):
    """No concurrency slot of the account came free before the request's deadline: not sent."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, NotSentReason.SLOT_WAIT, message)


# -- the shared limiter --------------------------------------------------------------------------

# The statements of the shared budget are the contract's functions (migration 160: recon.take_token,
# token_blocked, take_slot, renew_slots, release_slot, record_retry_after), which the app's workers
# call too: one implementation of each rule, whatever the language of the caller.

# At a high rate a process reserves the tokens of the next few tens of milliseconds in one
# statement: one statement per request made the bucket's row the bottleneck of a busy account.
# A held token not used within TOKEN_GRACE_S of its time is dropped, so a request never lands
# in a later window than the bucket counted it in (the budget's headroom covers the grace).
CHUNK_S = 0.05
TOKEN_GRACE_S = 0.1


def chunk_size(budget: Budget) -> int:
    """Tokens one statement reserves: ``CHUNK_S`` of the rate, at most a quarter of the burst;
    1 at the rates providers document for polling (e.g. 600 per minute)."""
    rate, burst = budget.bucket()
    return max(1, min(math.ceil(rate * CHUNK_S), burst // 4))


# Statement and lock timeout of the setup statements (ensure): a start fails in seconds, named.
SETUP_TIMEOUT_MS = 10_000
# The least time a token statement is given, however little of its request's bound is left.
TOKEN_STATEMENT_MIN_MS = 500


def _within(conn: sa.Connection, max_wait: float | None) -> None:
    """Bound the transaction's token statement by what the request may wait (at most the setup
    timeout): a bucket row held by a stuck session (a process that died inside its statement
    holds it until the server notices) is a database error at the request's bound, so the
    request is not sent, never sent late."""
    ms = (
        SETUP_TIMEOUT_MS
        if max_wait is None
        else min(SETUP_TIMEOUT_MS, max(TOKEN_STATEMENT_MIN_MS, max_wait * 1000))
    )
    conn.execute(_STATEMENT_WITHIN, {"ms": int(ms)})


# SET LOCAL statement_timeout to :ms, or keep a tighter one the connection already has.
_STATEMENT_WITHIN = sa.text(
    "SELECT set_config('statement_timeout', CAST(CAST(LEAST(CAST(:ms AS bigint), COALESCE(NULLIF("
    "EXTRACT(EPOCH FROM CAST(current_setting('statement_timeout') AS interval)) * 1000, 0), :ms)) AS bigint) AS text), true)"
)


class AccountLimiter:
    """One account's shared budget, as seen from this process (thread-safe)."""

    SLOT_WAIT_MAX_S = 600.0

    def __init__(
        self,
        limits: AccountLimits,
        engine: Callable[[], sa.Engine],
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.limits = limits
        self._engine = engine
        self._sleep = sleep
        self._ready = False
        self._ready_lock = threading.Lock()
        self._degraded_at = -math.inf
        # Reserved tokens not handed out yet, per bucket: their monotonic times, ascending.
        self._held: dict[str, deque[float]] = {"read": deque(), "create": deque()}
        self._held_lock = threading.Lock()
        self._renewer_of: tuple[int, SlotRenewer] | None = None

    def __repr__(self) -> str:
        return f"AccountLimiter({self.limits.account!r})"

    def ensure(self) -> None:
        """Create this account's rows; refuse (``LimitsConfigError``) a budget that differs from the
        account's row unless ``RECON_LIMITS_MIGRATE=1`` asks to change it for every process."""
        with self._ready_lock:
            if self._ready:
                return
            lim = self.limits
            with self._engine().begin() as conn:
                # Setup must never hang a start behind another process's lock or a huge insert.
                conn.execute(sa.text(f"SET LOCAL statement_timeout = {SETUP_TIMEOUT_MS}"))
                conn.execute(sa.text(f"SET LOCAL lock_timeout = {SETUP_TIMEOUT_MS}"))
                conn.execute(
                    sa.text(
                        "INSERT INTO provider_limit_accounts (account) VALUES (:a) ON CONFLICT DO NOTHING"
                    ),
                    {"a": lim.account},
                )
                for name, budget in (("read", lim.reads), ("create", lim.creates)):
                    if budget is not None:
                        self._ensure_bucket(conn, name, budget)
                if lim.concurrency:
                    conn.execute(
                        sa.text(
                            "INSERT INTO provider_limit_slots (account, slot) "
                            "SELECT :a, g FROM generate_series(0, :n - 1) g ON CONFLICT DO NOTHING"
                        ),
                        {"a": lim.account, "n": lim.concurrency},
                    )
            self._ready = True

    def _ensure_bucket(self, conn: sa.Connection, name: str, budget: Budget) -> None:
        lim = self.limits
        rate, burst = budget.bucket()
        params = {"a": lim.account, "b": name, "rate": rate, "burst": burst}
        conn.execute(
            sa.text(
                "INSERT INTO provider_limit_buckets (account, bucket, rate_per_s, burst, tokens) "
                "VALUES (:a, :b, :rate, :burst, :burst) ON CONFLICT (account, bucket) DO NOTHING"
            ),
            params,
        )
        row = conn.execute(
            sa.text(
                "SELECT rate_per_s, burst FROM provider_limit_buckets "
                "WHERE account = :a AND bucket = :b FOR UPDATE"
            ),
            params,
        ).one()
        have_rate, have_burst = float(row[0]), float(row[1])
        if math.isclose(have_rate, rate, rel_tol=1e-9) and have_burst == burst:
            return
        field_name = "reads" if name == "read" else "creates"
        if not budget_migration_requested():
            raise LimitsConfigError(
                f"{lim.source or limit_name('*')}: {field_name}={budget.requests}/{budget.window_s:g} "
                f"({_describe_bucket(rate, burst)}) differs from account {lim.account!r}'s shared {name} "
                f"budget in the database ({_as_budget(have_rate, have_burst)}, "
                f"{_describe_bucket(have_rate, have_burst)}); configure the same budget, or set "
                f"{MIGRATE_ENV}=1 once to change it for every process"
            )
        log.warning(
            "%s=1: account %r %s budget changed from %s to %s",
            MIGRATE_ENV, lim.account, name, _describe_bucket(have_rate, have_burst), _describe_bucket(rate, burst),
        )  # fmt: skip
        conn.execute(
            sa.text(
                "UPDATE provider_limit_buckets SET rate_per_s = :rate, burst = :burst, "
                "tokens = LEAST(tokens, :burst) WHERE account = :a AND bucket = :b"
            ),
            params,
        )

    def take_token(self, create: bool, max_wait: float | None = None, *, refund: int = 0) -> float:
        """Reserve one token of the read or create bucket; returns the seconds to wait for it.

        With ``max_wait``, a token that would come later is not taken at all: ``TokenRefused``
        says when the next one comes (the bucket is left as it was, so refusals never grow the
        wait of anyone after them). ``refund``: tokens the caller reserved before a Retry-After
        block and gives back, in the same statement (taken or not)."""
        budget = self.limits.budget(create)
        if budget is None:
            return 0.0
        bucket = "create" if create else "read"
        now = time.monotonic()
        with self._held_lock:
            held = self._held[bucket]
            while held and held[0] + TOKEN_GRACE_S < now:
                held.popleft()
            if not refund and held and (max_wait is None or held[0] - now <= max_wait):
                return max(0.0, held.popleft() - now)
        n = chunk_size(budget)
        params = {
            "account": self.limits.account, "bucket": bucket, "n": n, "max_wait_s": max_wait, "refund": refund,
        }  # fmt: skip
        self.ensure()
        with self._engine().begin() as conn:
            _within(conn, max_wait)
            answer = contract.call(conn, "take_token", **params)
        if answer["next"] == "no_budget":  # the rows went away (a wiped table): recreate them once
            with self._ready_lock:
                self._ready = False
            self.ensure()
            with self._engine().begin() as conn:
                _within(conn, max_wait)
                answer = contract.call(conn, "take_token", **params)
        contract.fix_call(answer)
        if answer["next"] == "no_budget":
            raise sa.exc.NoResultFound(str(answer["message"]))
        tokens, rate, blocked_s = (
            float(answer["tokens"]),
            float(answer["rate_per_s"]),
            float(answer["blocked_s"]),
        )
        taken = int(answer["taken"])
        if answer["next"] == "not_sent":
            raise TokenRefused(blocked_s, float(answer["retry_in_s"]))
        # Token j of the ``taken`` (1-based) left the balance at tokens + taken - j.
        # (the function's wait_s is the first; the rest are this process's chunk, held below)
        waits = [float(answer["wait_s"])]
        waits += [blocked_s + max(0.0, -(tokens + taken - j)) / rate for j in range(2, taken + 1)]
        if taken > 1:
            now = time.monotonic()
            with self._held_lock:
                self._held[bucket].extend(now + w for w in waits[1:])
        return waits[0]

    def take_slot(self, kind: str) -> tuple[int, str] | None:
        """One concurrency slot for ``kind`` if one is free to it now: ``(slot, holder)``. The
        caller must ``release`` it; ``request`` also keeps it alive while the request runs."""
        lim = self.limits
        self.ensure()
        holder = uuid.uuid4().hex
        params = {
            "account": lim.account,
            "kind": kind,
            "holder": holder,
            "n": lim.concurrency,
            "ttl_s": lim.slot_ttl_s,
            "cap": lim.kind_cap(),
            "reserve": lim.reserve(),
        }
        with self._engine().begin() as conn:
            answer = contract.call(conn, "take_slot", **params)
        contract.fix_call(answer)
        return (int(answer["slot"]), holder) if answer["next"] == "send" else None

    def release(self, slot: int, holder: str) -> None:
        self._renewer.forget(holder)
        with self._engine().begin() as conn:
            contract.call(conn, "release_slot", account=self.limits.account, slot=slot, holder=holder)

    def renew(self, holders: Collection[str]) -> None:
        """Push the expiry of slots this process holds one TTL out (the renewer's statement)."""
        if holders:
            with self._engine().begin() as conn:
                contract.call(
                    conn, "renew_slots", account=self.limits.account, holders=list(holders),
                    ttl_s=self.limits.slot_ttl_s,
                )  # fmt: skip

    def block_for(self, seconds: float) -> None:
        """The provider said Retry-After: nobody on this account sends before then."""
        if seconds <= 0:
            return
        with self._held_lock:  # tokens held here were reserved before the provider said wait
            for held in self._held.values():
                held.clear()
        try:
            self.ensure()
            with self._engine().begin() as conn:
                _within(conn, None)  # never held past the setup timeout behind a stuck bucket row
                contract.call(conn, "record_retry_after", account=self.limits.account, seconds=float(seconds))
        except _DB_ERRORS as exc:
            self._unreachable(exc, "the provider's Retry-After is not shared with other processes")

    def _wait_bound(self, deadline: float | None) -> tuple[float, str]:
        """How long a request may wait for its slot and token, and what bounds it (for messages)."""
        lease_s = stale_part_age_s()
        left = math.inf if deadline is None else deadline - time.monotonic()
        if left < lease_s:
            return max(0.0, left), f"the request's deadline ({max(0.0, left):.1f} s left)"
        return lease_s, f"the run's lease ({Settings.lease_s.name}={lease_s:g})"

    def _unreachable(self, exc: BaseException, consequence: str) -> None:
        """Log (once a minute per account) that the shared tables did not answer."""
        now = time.monotonic()
        if now - self._degraded_at >= 60:
            self._degraded_at = now
            first = str(exc).splitlines()[0] if str(exc) else ""
            log.error(
                "shared limits of account %r unreachable (%s: %s); %s until the database answers "
                "(is migration 140 applied?)",
                self.limits.account, type(exc).__name__, first, consequence,
            )  # fmt: skip
        with self._ready_lock:
            self._ready = False

    def _slot_within(self, kind: str, bound_s: float, bound: str) -> tuple[int, str]:
        """A slot for ``kind`` taken within ``bound_s`` seconds, else ``AccountBusy``."""
        started = time.monotonic()
        until = started + min(bound_s, self.SLOT_WAIT_MAX_S)
        delay, rebuilt = 0.01, False
        while True:
            held = self.take_slot(kind)
            if held is not None:
                return held
            if not rebuilt:  # the slot rows may have gone (a wiped table): recreate them once
                rebuilt = True
                with self._ready_lock:
                    self._ready = False
                self.ensure()
                continue
            now = time.monotonic()
            if now >= until:
                raise AccountBusy(
                    kind,
                    f"account {self.limits.account!r}: no concurrency slot came free in "
                    f"{now - started:.1f} s, before {bound}; not sent",
                )
            self._sleep(min(until - now, delay * random.uniform(0.5, 1.5)))
            delay = min(0.25, delay * 2)

    def _token_within(self, kind: str, create: bool, bound_s: float, bound: str) -> None:
        """Wait for a token that comes within ``bound_s``; a later one is not taken: ``NotSent``.

        A request that slept for its token and wakes inside a Retry-After block (the provider
        throttled the account while it slept) does not go out: it gives the token back and
        queues again behind the block, within what is left of ``bound_s``."""
        until = time.monotonic() + bound_s
        refund = 0
        while True:
            left = max(0.0, until - time.monotonic())
            try:
                wait = self.take_token(create, max_wait=left, refund=refund)
            except TokenRefused as refused:
                reason = (
                    NotSentReason.LIMITER_REFUSED if refused.blocked_s > left else NotSentReason.TOKEN_WAIT
                )
                what = (
                    f"the account is blocked by the provider's Retry-After for {refused.blocked_s:.1f} s"
                    if reason is NotSentReason.LIMITER_REFUSED
                    else f"the next token comes in {refused.next_s:.1f} s"
                )
                raise TokenWaitTooLong(
                    kind, None, f"account {self.limits.account!r}: {what}, after {bound}; not waited for",
                    retry_in_s=refused.next_s, reason=reason,
                ) from None  # fmt: skip
            if wait <= 0:
                return
            self._sleep(wait)
            if self._blocked_s(create) <= 0:
                return
            refund = 1

    def _blocked_s(self, create: bool) -> float:
        """Seconds the account's bucket is still blocked by a provider's Retry-After (0: not)."""
        bucket = "create" if create else "read"
        with self._engine().connect() as conn:
            answer = contract.call(conn, "token_blocked", account=self.limits.account, bucket=bucket)
        return float(answer["blocked_s"])

    @contextmanager
    def request(self, kind: str, *, create: bool, deadline: float | None = None) -> Iterator[None]:
        """Hold a slot (if the account limits concurrency) and a rate token for one request.

        A slot or a token that comes after ``deadline`` (monotonic; the request's own) or after the
        run's lease (``RECON_LEASE_S``) is not waited for, and a token that would come later is not
        taken: ``NotSent`` (``TokenWaitTooLong``, ``AccountBusy``). A limiter that cannot reach its
        tables fails closed: ``NotSent`` with reason ``limiter_database_unreachable``, nothing held.
        The slot is kept alive while the request runs and released however it ends.
        """
        held: tuple[int, str] | None = None
        bound_s, bound = self._wait_bound(deadline)
        try:
            if self.limits.concurrency:
                held = self._slot_within(kind, bound_s, bound)
                self._renewer.keep(held[1])
                bound_s, bound = self._wait_bound(deadline)  # what the slot wait left of it
            self._token_within(kind, create, bound_s, bound)
        except _DB_ERRORS as exc:
            self._give_back(held)
            self._unreachable(exc, "requests are not sent")
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise NotSent(
                kind,
                NotSentReason.LIMITER_DB,
                f"account {self.limits.account!r}: {type(exc).__name__}: {first}",
            ) from None
        except LimitsConfigError as exc:  # this process's budget differs from the account's
            self._give_back(held)
            raise NotSent(kind, NotSentReason.LIMITER_REFUSED, str(exc)) from None
        except BaseException:
            self._give_back(held)  # a request that will not be sent gives its slot back at once
            raise
        try:
            yield
        finally:
            self._give_back(held)

    def _give_back(self, held: tuple[int, str] | None) -> None:
        """Release a slot now; if the database does not answer, it is no longer renewed and
        frees itself at its expiry."""
        if held is None:
            return
        try:
            self.release(*held)
        except _DB_ERRORS as exc:
            self._unreachable(exc, "a slot frees itself at its expiry")

    @property
    def _renewer(self) -> SlotRenewer:
        pid = os.getpid()
        with self._ready_lock:
            if self._renewer_of is None or self._renewer_of[0] != pid:  # none yet, or a forked child
                renewer = SlotRenewer(
                    self.limits.account, self.limits.slot_ttl_s, self.renew,
                    lambda exc: self._unreachable(exc, "slots in flight are not renewed"), _DB_ERRORS,
                )  # fmt: skip
                self._renewer_of = (pid, renewer)
            return self._renewer_of[1]


class TokenRefused(Exception):
    """``take_token(max_wait=...)``: no token comes in time; none was taken."""

    def __init__(self, blocked_s: float, next_s: float) -> None:
        super().__init__(f"next token in {next_s:.1f} s")
        self.blocked_s = blocked_s
        self.next_s = next_s


def verify_account_budgets(environ: dict[str, str] | None = None) -> None:
    """At start: every provider's configured budget against its account's rows (created when
    missing); a budget that differs refuses the start with ``LimitsConfigError``."""
    if not shared_limits_enabled(environ):
        return
    for provider in DEFAULT_LIMITS:
        limiter = account_limiter(account_limits_from_env(provider, environ))
        if limiter is not None:
            limiter.ensure()


_ACCOUNTS: dict[AccountLimits, AccountLimiter] = {}
_ACCOUNTS_LOCK = threading.Lock()


def account_limiter(limits: AccountLimits | None) -> AccountLimiter | None:
    """The process's limiter for ``limits`` (one per configuration); None: per-process only."""
    if limits is None:
        return None
    with _ACCOUNTS_LOCK:
        limiter = _ACCOUNTS.get(limits)
        if limiter is None:
            limiter = AccountLimiter(limits, get_engine)
            _ACCOUNTS[limits] = limiter
        return limiter


__all__ = [
    "DEFAULT_LIMITS",
    "LIMITS_MODE_ENV",
    "MAX_CONCURRENCY",
    "MAX_REQUESTS",
    "MAX_WINDOW_S",
    "MIGRATE_ENV",
    "MIN_WINDOW_S",
    "TOKEN_GRACE_S",
    "AccountBusy",
    "AccountLimiter",
    "AccountLimits",
    "Budget",
    "LimitsConfigError",
    "RunShape",
    "TokenWaitTooLong",
    "account_limiter",
    "account_limits_from_env",
    "batch_sizes_within_budgets",
    "BATCH_POLL_WINDOW_S",
    "budget_migration_requested",
    "chunk_size",
    "parse_account_limits",
    "poll_budgets",
    "polls_per_cadence",
    "resource_limit_fields",
    "run_shape",
    "shared_limits_enabled",
    "verify_account_budgets",
]
