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
  process may still spend the tokens it reserved before the block: at most one chunk, 1 at the
  documented polling rates).

Budgets come from ``RECON_LIMIT_<PROVIDER>`` (``limit_config.parse_account_limits``), with defaults per provider
from their documented limits. The per-process limiter in ``http.py`` stays as a fast path and is
the fallback when no account is configured (``RECON_LIMITS=process``, or a resource built by hand,
e.g. in unit tests) or the tables cannot be reached (logged).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from recon_dagster.core.deadlines import stale_part_age_s
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
    POLLED_PROVIDERS,
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
    resource_limit_fields,
    run_shape,
    shared_limits_enabled,
)
from recon_dagster.providers.status import ProviderHTTPError

_DB_ERRORS = (sa.exc.SQLAlchemyError, DatabaseUnavailable)

log = logging.getLogger("recon_dagster.providers.limits")


class TokenWaitTooLong(ProviderHTTPError):
    """The account's next token comes after the request's deadline or the run's lease: the request
    fails now (an error outcome, attempt counted) instead of sleeping past them."""


class AccountBusy(RuntimeError):
    """No concurrency slot of the account came free within the wait bound."""


# -- the shared limiter --------------------------------------------------------------------------

_TAKE = sa.text(
    """
    UPDATE provider_limit_buckets
    SET tokens = LEAST(burst, tokens + GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - stamp)) * rate_per_s) - :n,
        stamp = GREATEST(stamp, clock_timestamp())
    WHERE account = :account AND bucket = :bucket
    RETURNING tokens, rate_per_s, GREATEST(0, EXTRACT(EPOCH FROM stamp - clock_timestamp()))
    """
)

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


# Take a slot: one under the kind's cap, or any while more than ``reserve`` stay free. Row locks
# make the account bound exact; the per-kind counts are read without locks, so the share is
# approximate under contention (fairness, not a provider limit).
_SLOT = sa.text(
    """
    WITH live AS (
      SELECT count(*) FILTER (WHERE holder IS NULL OR expires_at < clock_timestamp()) AS free,
             count(*) FILTER (WHERE kind = :kind AND holder IS NOT NULL AND expires_at >= clock_timestamp()) AS mine
      FROM provider_limit_slots WHERE account = :account AND slot < :n
    )
    UPDATE provider_limit_slots s
    SET holder = :holder, kind = :kind, expires_at = clock_timestamp() + make_interval(secs => :ttl)
    WHERE s.account = :account AND s.slot = (
      SELECT slot FROM provider_limit_slots, live
      WHERE account = :account AND slot < :n AND (holder IS NULL OR expires_at < clock_timestamp())
        AND (live.mine < :cap OR live.free > :reserve)
      ORDER BY slot LIMIT 1 FOR UPDATE OF provider_limit_slots SKIP LOCKED)
    RETURNING s.slot
    """
)

_RELEASE = sa.text(
    "UPDATE provider_limit_slots SET holder = NULL, kind = NULL, expires_at = 'epoch' "
    "WHERE account = :account AND slot = :slot AND holder = :holder"
)

_BLOCK = sa.text(
    """
    WITH a AS (
      INSERT INTO provider_limit_accounts (account, blocked_until, retry_afters)
      VALUES (:account, clock_timestamp() + make_interval(secs => :secs), 1)
      ON CONFLICT (account) DO UPDATE
        SET blocked_until = GREATEST(provider_limit_accounts.blocked_until, EXCLUDED.blocked_until),
            retry_afters = provider_limit_accounts.retry_afters + 1, updated_at = now()
      RETURNING blocked_until)
    UPDATE provider_limit_buckets SET tokens = LEAST(tokens, 0), stamp = GREATEST(stamp, (SELECT blocked_until FROM a))
    WHERE account = :account
    """
)


# Statement and lock timeout of the setup statements (ensure): a start fails in seconds, named.
SETUP_TIMEOUT_MS = 10_000


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
                f"{lim.source or 'RECON_LIMIT_*'}: {field_name}={budget.requests}/{budget.window_s:g} "
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

    def take_token(self, create: bool) -> float:
        """Reserve one token of the read or create bucket; returns the seconds to wait for it."""
        budget = self.limits.budget(create)
        if budget is None:
            return 0.0
        bucket = "create" if create else "read"
        now = time.monotonic()
        with self._held_lock:
            held = self._held[bucket]
            while held and held[0] + TOKEN_GRACE_S < now:
                held.popleft()
            if held:
                return max(0.0, held.popleft() - now)
        n = chunk_size(budget)
        params = {"account": self.limits.account, "bucket": bucket, "n": n}
        self.ensure()
        with self._engine().begin() as conn:
            row = conn.execute(_TAKE, params).one_or_none()
        if row is None:  # the rows went away (a wiped table): recreate them once
            with self._ready_lock:
                self._ready = False
            self.ensure()
            with self._engine().begin() as conn:
                row = conn.execute(_TAKE, params).one()
        tokens, rate, blocked_s = float(row[0]), float(row[1]), float(row[2])
        # Token j of the n (1-based) left the balance at tokens + n - j.
        waits = [blocked_s + max(0.0, -(tokens + n - j)) / rate for j in range(1, n + 1)]
        if n > 1:
            now = time.monotonic()
            with self._held_lock:
                self._held[bucket].extend(now + w for w in waits[1:])
        return waits[0]

    def take_slot(self, kind: str) -> tuple[int, str] | None:
        """One concurrency slot for ``kind`` if one is free to it now: ``(slot, holder)``."""
        lim = self.limits
        self.ensure()
        holder = uuid.uuid4().hex
        params = {
            "account": lim.account,
            "kind": kind,
            "holder": holder,
            "n": lim.concurrency,
            "ttl": lim.slot_ttl_s,
            "cap": lim.kind_cap(),
            "reserve": lim.reserve(),
        }
        with self._engine().begin() as conn:
            slot = conn.execute(_SLOT, params).scalar_one_or_none()
        return None if slot is None else (int(slot), holder)

    def release(self, slot: int, holder: str) -> None:
        with self._engine().begin() as conn:
            conn.execute(_RELEASE, {"account": self.limits.account, "slot": slot, "holder": holder})

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
                conn.execute(_BLOCK, {"account": self.limits.account, "secs": float(seconds)})
        except _DB_ERRORS as exc:
            self._degraded(exc)

    def _check_wait(self, kind: str, wait: float, deadline: float | None) -> None:
        lease_s = stale_part_age_s()
        left = math.inf if deadline is None else deadline - time.monotonic()
        if wait <= min(left, lease_s):
            return
        bound = (
            f"the request's deadline ({max(0.0, left):.1f} s left)"
            if left < lease_s
            else (f"the run's lease (RECON_LEASE_S={lease_s:g})")
        )
        raise TokenWaitTooLong(
            kind,
            None,
            f"account {self.limits.account!r}: the next token comes in {wait:.1f} s, after {bound}; not waited for",
        )

    def _degraded(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._degraded_at >= 60:
            self._degraded_at = now
            log.error(
                "shared limits of account %r unavailable (%s: %s); per-process limits only until "
                "the database answers (is migration 140 applied?)",
                self.limits.account,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
        with self._ready_lock:
            self._ready = False

    @contextmanager
    def request(self, kind: str, *, create: bool, deadline: float | None = None) -> Iterator[None]:
        """Hold a slot (if the account limits concurrency) and a rate token for one request.

        A token that comes after ``deadline`` (monotonic; the request's own) or after the run's
        lease (``RECON_LEASE_S``) is not waited for: ``TokenWaitTooLong``.
        """
        held: tuple[int, str] | None = None
        try:
            if self.limits.concurrency:
                delay, waited = 0.01, 0.0
                while True:
                    held = self.take_slot(kind)
                    if held is not None:
                        break
                    if waited == 0.0:  # the slot rows may have gone (a wiped table): recreate them
                        with self._ready_lock:
                            self._ready = False
                        self.ensure()
                    if waited >= self.SLOT_WAIT_MAX_S:
                        raise AccountBusy(f"{kind}: no {self.limits.account} slot free for {waited:.0f} s")
                    pause = delay * random.uniform(0.5, 1.5)
                    self._sleep(pause)
                    waited += pause
                    delay = min(0.25, delay * 2)
            wait = self.take_token(create)
            if wait > 0:
                self._check_wait(kind, wait, deadline)
                self._sleep(wait)
        except _DB_ERRORS as exc:
            self._degraded(exc)
            held = None
        except BaseException:
            if held is not None:  # a request that will not be sent gives its slot back at once
                with contextlib.suppress(*_DB_ERRORS):
                    self.release(*held)
            raise
        try:
            yield
        finally:
            if held is not None:
                try:
                    self.release(*held)
                except _DB_ERRORS as exc:  # the slot frees itself at its expiry
                    self._degraded(exc)


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
    "POLLED_PROVIDERS",
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
    "resource_limit_fields",
    "run_shape",
    "shared_limits_enabled",
    "verify_account_budgets",
]
