"""Provider account budgets as configured: ``RECON_LIMIT_<PROVIDER>`` parsed and bounded, the
defaults per provider, and the run shape that follows from them. The shared limiter that enforces
them across processes is ``providers/limits.py``."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

LIMITS_MODE_ENV = "RECON_LIMITS"  # "database" (default) or "process"


class LimitsConfigError(ValueError):
    """A malformed ``RECON_LIMIT_*`` value; the message names the variable."""


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


MIGRATE_ENV = "RECON_LIMITS_MIGRATE"


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
