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

Budgets come from ``RECON_LIMIT_<PROVIDER>`` (``parse_account_limits``), with defaults per provider
from their documented limits. The per-process limiter in ``http.py`` stays as a fast path and is
the fallback when no account is configured (``RECON_LIMITS=process``, or a resource built by hand,
e.g. in unit tests) or the tables cannot be reached (logged).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa

from recon_dagster.db.engine import DatabaseUnavailable, get_engine
from recon_dagster.deadlines import stale_part_age_s
from recon_dagster.providers.status import ProviderHTTPError

_DB_ERRORS = (sa.exc.SQLAlchemyError, DatabaseUnavailable)

log = logging.getLogger("recon_dagster.providers.limits")

LIMITS_MODE_ENV = "RECON_LIMITS"  # "database" (default) or "process"


class LimitsConfigError(ValueError):
    """A malformed ``RECON_LIMIT_*`` value; the message names the variable."""


class TokenWaitTooLong(ProviderHTTPError):
    """The account's next token comes after the request's deadline or the run's lease: the request
    fails now (an error outcome, attempt counted) instead of sleeping past them."""


class AccountBusy(RuntimeError):
    """No concurrency slot of the account came free within the wait bound."""


@dataclass(frozen=True)
class Budget:
    """At most ``requests`` in any window of ``window_s`` seconds, as the provider states it."""

    requests: int
    window_s: float

    def __post_init__(self) -> None:
        if self.requests < 1 or self.window_s <= 0:
            raise LimitsConfigError(f"a budget needs requests >= 1 and window > 0, got {self}")

    @property
    def per_s(self) -> float:
        return self.requests / self.window_s

    def bucket(self) -> tuple[float, int]:
        """``(rate per s, burst)`` of a token bucket that never admits more than the budget.

        A bucket admits at most ``burst + rate * window`` in any window. A little headroom (2%,
        at least one request) covers the spread between a token's time and the request's arrival
        at the provider; a small burst (5%) keeps the sustained rate near the budget.
        """
        headroom = max(1, math.ceil(self.requests * 0.02))
        burst = max(1, round(self.requests * 0.05))
        sustained = self.requests - headroom - burst
        if sustained <= 0:  # a tiny budget (e.g. 2 per window): one at a time, evenly spaced
            return max(self.requests - 1, 1) / self.window_s, 1
        return sustained / self.window_s, burst


@dataclass(frozen=True)
class AccountLimits:
    """One provider account's shared budget."""

    account: str
    reads: Budget | None = None
    creates: Budget | None = None
    concurrency: int | None = None
    # Share of the account's slots one kind may hold while other kinds want slots.
    kind_share: float = 0.5
    # A slot whose holder vanished is free again after this long (longer than any request).
    slot_ttl_s: float = 180.0
    # Where this budget was configured (the variable), named in errors.
    source: str = field(default="", compare=False)

    def budget(self, create: bool) -> Budget | None:
        return self.creates if create else self.reads

    def kind_cap(self) -> int:
        """Slots one kind may hold while other kinds want slots (at least 1)."""
        return max(1, math.floor((self.concurrency or 1) * self.kind_share))

    def reserve(self) -> int:
        """Slots a kind over its cap leaves free, so a kind under its cap always finds one."""
        n = self.concurrency or 1
        return max(1, n // 8) if n > 1 else 0


# Documented limits where the provider publishes them; our own ceilings elsewhere (marked).
DEFAULT_LIMITS: dict[str, AccountLimits] = {
    # KIE: about 20 new generation requests per 10 s per account. Reads: not documented; 600/min
    # is our own ceiling.
    "kie": AccountLimits("kie", reads=Budget(600, 60), creates=Budget(20, 10), concurrency=48),
    # Replicate: create 600/min, every other call 3000/min.
    "replicate": AccountLimits("replicate", reads=Budget(3000, 60), creates=Budget(600, 60), concurrency=64),
    # ElevenLabs limits concurrent requests per plan (5-15 on the lower tiers); rates are ours.
    "elevenlabs": AccountLimits("elevenlabs", reads=Budget(600, 60), creates=Budget(60, 60), concurrency=16),
    # Anthropic: requests per minute per tier (50 on tier 1); calls are billed creates.
    "anthropic": AccountLimits("anthropic", reads=None, creates=Budget(50, 60), concurrency=16),
}


# Bounds of a configured budget (README, Configuration): beyond them a value is a typo, and an
# absurd one hangs the account (a billion slot rows, a window of a nanosecond or of forever).
MAX_REQUESTS = 1_000_000
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 86_400.0
MAX_CONCURRENCY = 1_000
UNLIMITED = ("none", "off")


def _parse_budget(name: str, text: str) -> Budget | None:
    if text.lower() in UNLIMITED:
        return None
    count, _, window = text.partition("/")
    shape = f"{name}: a budget is N/SECONDS (e.g. 600/60) or none"
    try:
        requests = int(count)
        window_s = float(window.removesuffix("s") or 60)
    except ValueError:
        raise LimitsConfigError(f"{shape}, got {text!r}") from None
    if not 1 <= requests <= MAX_REQUESTS:
        raise LimitsConfigError(
            f"{shape}, with N from 1 to {MAX_REQUESTS} ('none' for unlimited), got {text!r}"
        )
    if not (math.isfinite(window_s) and MIN_WINDOW_S <= window_s <= MAX_WINDOW_S):
        raise LimitsConfigError(
            f"{shape}, with SECONDS from {MIN_WINDOW_S:g} to {MAX_WINDOW_S:g}, got {text!r}"
        )
    return Budget(requests, window_s)


def _parse_concurrency(name: str, value: str) -> int | None:
    if value.lower() in UNLIMITED:
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_CONCURRENCY:
        raise LimitsConfigError(
            f"{name}: concurrency is a whole number from 1 to {MAX_CONCURRENCY} or none, got {value!r}"
        )
    return int(value)


def parse_account_limits(name: str, raw: str, default: AccountLimits) -> AccountLimits:
    """``RECON_LIMIT_<PROVIDER>``: comma-separated ``reads=N/S``, ``creates=N/S``,
    ``concurrency=N|none``, ``kind_share=F``, ``account=NAME``; omitted fields keep ``default``.
    Every value is checked against the bounds above; ``none`` is the only way to say unlimited."""
    limits = replace(default, source=name)
    for part in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not value:
            raise LimitsConfigError(f"{name}: expected key=value, got {part!r}")
        if key == "reads":
            limits = replace(limits, reads=_parse_budget(name, value))
        elif key == "creates":
            limits = replace(limits, creates=_parse_budget(name, value))
        elif key == "concurrency":
            limits = replace(limits, concurrency=_parse_concurrency(name, value))
        elif key == "kind_share":
            try:
                share = float(value)
            except ValueError:
                share = math.nan
            if not 0 < share <= 1:  # NaN fails this too
                raise LimitsConfigError(f"{name}: kind_share must be a number in (0, 1], got {value!r}")
            limits = replace(limits, kind_share=share)
        elif key == "account":
            limits = replace(limits, account=value)
        else:
            raise LimitsConfigError(
                f"{name}: unknown field {key!r} (reads, creates, concurrency, kind_share, account)"
            )
    return limits


def account_limits_from_env(provider: str, environ: dict[str, str] | None = None) -> AccountLimits:
    """The budget of ``provider``'s account: its default, overridden by ``RECON_LIMIT_<PROVIDER>``."""
    env = os.environ if environ is None else environ
    name = f"RECON_LIMIT_{provider.upper()}"
    return parse_account_limits(name, env.get(name, ""), DEFAULT_LIMITS[provider])


def shared_limits_enabled(environ: dict[str, str] | None = None) -> bool:
    """``RECON_LIMITS``: ``database`` (default) shares budgets through PostgreSQL; ``process``
    keeps today's per-process limiter only (for comparison, or a deployment of one process)."""
    raw = (os.environ if environ is None else environ).get(LIMITS_MODE_ENV, "").strip().lower()
    if raw in ("", "database", "shared"):
        return True
    if raw in ("process", "local"):
        return False
    raise LimitsConfigError(f"{LIMITS_MODE_ENV} must be 'database' or 'process', got {raw!r}")


def resource_limit_fields(provider: str, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Config fields of a provider resource wired from the environment: the per-process buckets
    at the account's budget (the fast path, and the whole limiter in ``process`` mode) and
    whether to share the budget through the database."""
    limits = account_limits_from_env(provider, environ)
    fields: dict[str, Any] = {"shared_limits": shared_limits_enabled(environ)}
    for name, budget in (("read", limits.reads), ("create", limits.creates)):
        rate, burst = budget.bucket() if budget is not None else (None, 1)
        fields[f"{name}_rate_per_s"] = rate
        fields[f"{name}_burst"] = burst
    return fields


# -- run shape ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunShape:
    """How many reconcile runs of one provider may run at once, and how big a batch may be."""

    provider_runs: int
    batch_cap: int | None


def run_shape(limits: AccountLimits, run_concurrency: int, lease_s: float) -> RunShape:
    """Run-queue numbers that follow the account budget.

    Runs of one provider together hold at most ``provider_runs * run_concurrency`` requests, which
    must fit the account's slots (else runs start only to wait on the limiter); a run's batch
    must finish within half its lease at its share of the read rate (one poll per job at least),
    else the lease expires mid-run and another run takes the jobs over.
    """
    if run_concurrency < 1:
        raise ValueError("run_concurrency must be at least 1")
    runs = max(1, (limits.concurrency or run_concurrency) // run_concurrency)
    cap = None
    if limits.reads is not None:
        rate, _ = limits.reads.bucket()
        cap = max(1, math.floor(rate / runs * lease_s / 2))
    return RunShape(runs, cap)


# Providers whose kinds the reconcile runs poll (the others' kinds are synchronous: swept only).
POLLED_PROVIDERS = ("kie", "replicate", "elevenlabs")


def batch_size_within_budgets(batch_size: int, run_concurrency: int, lease_s: float) -> int:
    """``batch_size``, lowered where an account's read budget (from the environment) could not
    poll a whole batch within half its lease (see ``run_shape``)."""
    caps = [
        run_shape(account_limits_from_env(p), run_concurrency, lease_s).batch_cap for p in POLLED_PROVIDERS
    ]
    return min([batch_size, *(c for c in caps if c is not None)])


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


MIGRATE_ENV = "RECON_LIMITS_MIGRATE"
# Statement and lock timeout of the setup statements (ensure): a start fails in seconds, named.
SETUP_TIMEOUT_MS = 10_000


def budget_migration_requested(environ: dict[str, str] | None = None) -> bool:
    """``RECON_LIMITS_MIGRATE=1``: this process's budgets replace the account's rows."""
    raw = (os.environ if environ is None else environ).get(MIGRATE_ENV, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise LimitsConfigError(f"{MIGRATE_ENV} must be 1 or 0, got {raw!r}")


def _describe_bucket(rate: float, burst: float) -> str:
    return f"{rate:.6g}/s, burst {burst:g}"


def _as_budget(rate: float, burst: float) -> str:
    """The budget whose bucket is ``(rate, burst)``, when one of a plain form matches (else '?')."""
    for window in (1, 10, 60, 3600, 86400):
        for requests in range(1, MAX_REQUESTS + 1):
            r, b = Budget(requests, window).bucket()
            if math.isclose(r, rate, rel_tol=1e-9) and b == burst:
                return f"{requests}/{window}"
            if r > rate * 1.01:
                break
    return "a budget set elsewhere"


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
    "AccountBusy",
    "AccountLimiter",
    "AccountLimits",
    "Budget",
    "LimitsConfigError",
    "RunShape",
    "TokenWaitTooLong",
    "account_limiter",
    "account_limits_from_env",
    "batch_size_within_budgets",
    "chunk_size",
    "parse_account_limits",
    "resource_limit_fields",
    "run_shape",
    "shared_limits_enabled",
    "verify_account_budgets",
]
