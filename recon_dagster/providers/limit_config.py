"""Provider account budgets as configured: ``RECON_LIMIT_<PROVIDER>`` parsed and bounded, the
defaults per provider, and the run shape that follows from them. The shared limiter that enforces
them across processes is ``providers/limits.py``."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from recon_dagster.config import (
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    LimitsConfigError,
    Settings,
    limit_var,
    parse_limit_overrides,
    settings,
)
from recon_dagster.core.kinds import ProviderSpec, Rate, polled_providers, provider_names, provider_specs

# Passed on from config: the bounds and the error of a budget.
__all__ = [
    "MAX_CONCURRENCY",
    "MAX_REQUESTS",
    "MAX_WINDOW_S",
    "MIN_WINDOW_S",
    "LimitsConfigError",
    "parse_limit_overrides",
]

LIMITS_MODE_ENV = Settings.limits.name  # "database" (default) or "process"


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


class _DefaultLimits(Mapping[str, AccountLimits]):
    """``DEFAULT_LIMITS``: each provider's budget as its spec declares it (documented limits where
    the provider publishes them, our own ceilings elsewhere), read from the registry on first use."""

    def _table(self) -> dict[str, AccountLimits]:
        return {spec.name: default_limits(spec) for spec in provider_specs()}

    def __getitem__(self, provider: str) -> AccountLimits:
        return self._table()[provider]

    def __iter__(self) -> Iterator[str]:
        return iter(provider_names())

    def __len__(self) -> int:
        return len(provider_names())


def default_limits(spec: ProviderSpec) -> AccountLimits:
    """A provider's default account budget, from its spec."""

    def budget(rate: Rate | None) -> Budget | None:
        return None if rate is None else Budget(rate.requests, rate.window_s)

    return AccountLimits(
        spec.name, reads=budget(spec.reads), creates=budget(spec.creates), concurrency=spec.concurrency
    )


DEFAULT_LIMITS: Mapping[str, AccountLimits] = _DefaultLimits()


def parse_account_limits(name: str, raw: str, default: AccountLimits) -> AccountLimits:
    """``default`` overridden by the fields of a ``RECON_LIMIT_<PROVIDER>`` value (the syntax
    and its bounds are declared in ``recon_dagster.config``)."""
    return _with_overrides(name, default, parse_limit_overrides(name, raw))


def _with_overrides(name: str, default: AccountLimits, fields: dict[str, Any]) -> AccountLimits:
    budgets = {
        k: Budget(*v) if v is not None else None for k, v in fields.items() if k in ("reads", "creates")
    }
    return replace(default, source=name, **{**fields, **budgets})


def account_limits_from_env(provider: str, environ: dict[str, str] | None = None) -> AccountLimits:
    """The budget of ``provider``'s account: its default, overridden by ``RECON_LIMIT_<PROVIDER>``."""
    return _with_overrides(
        limit_var(provider).name, DEFAULT_LIMITS[provider], settings(environ).limit_overrides(provider)
    )


def shared_limits_enabled(environ: dict[str, str] | None = None) -> bool:
    """``RECON_LIMITS``: ``database`` (default) shares budgets through PostgreSQL; ``process``
    keeps today's per-process limiter only (for comparison, or a deployment of one process)."""
    return settings(environ).limits


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


# A batch run's polls should take about this long at its share of a binding read budget. Under
# a binding budget CPU is not what limits the drain: short runs interleave (one run polls while
# another stores media), so the budget is used all along, jobs settle from the first minute on,
# and a crashed run strands fewer jobs. Where the budget does not bind, RECON_BATCH_SIZE rules
# (fewer, longer runs: each run's worker costs seconds of CPU to start).
BATCH_POLL_WINDOW_S = 60.0


def run_shape(limits: AccountLimits, run_concurrency: int, lease_s: float) -> RunShape:
    """Run-queue numbers that follow the account budget.

    Runs of one provider together hold at most ``provider_runs * run_concurrency`` requests, which
    must fit the account's slots (else runs start only to wait on the limiter). A run's batch is
    what it polls (one poll per job at least) at its share of the read rate within
    ``BATCH_POLL_WINDOW_S``, and never more than within half its lease (else the lease expires
    mid-run and another run takes the jobs over).
    """
    if run_concurrency < 1:
        raise ValueError("run_concurrency must be at least 1")
    runs = max(1, (limits.concurrency or run_concurrency) // run_concurrency)
    cap = None
    if limits.reads is not None:
        rate, _ = limits.reads.bucket()
        cap = max(1, math.floor(rate / runs * min(BATCH_POLL_WINDOW_S, lease_s / 2)))
    return RunShape(runs, cap)


def batch_sizes_within_budgets(batch_size: int, run_concurrency: int, lease_s: float) -> dict[str, int]:
    """Per polled provider: ``batch_size``, lowered where the account's read budget (from the
    environment) binds (see ``run_shape``). A tight budget on one account leaves the others'
    batches alone."""
    sizes = {}
    for provider in polled_providers():
        cap = run_shape(account_limits_from_env(provider), run_concurrency, lease_s).batch_cap
        sizes[provider] = batch_size if cap is None else min(batch_size, cap)
    return sizes


def polls_per_cadence(limits: AccountLimits, cadence_s: float) -> int | None:
    """Polls the account's read budget serves in one reconcile cadence at its sustained rate (None:
    no read budget). The sensor never keeps more polls of one provider requested (queued or
    running) than this: a job asked for beyond it would wait past the cadence for its token."""
    if limits.reads is None:
        return None
    rate, burst = limits.reads.bucket()
    return max(1, math.floor(rate * max(cadence_s, 1.0)) + burst)


def poll_budgets(cadence_s: float, environ: dict[str, str] | None = None) -> dict[str, int | None]:
    """``polls_per_cadence`` of every polled provider's account from the environment; None for
    all with per-process limits (``RECON_LIMITS=process``: every process a whole budget)."""
    shared = shared_limits_enabled(environ)
    return {
        p: polls_per_cadence(account_limits_from_env(p, environ), cadence_s) if shared else None
        for p in polled_providers()
    }


MIGRATE_ENV = Settings.limits_migrate.name


def budget_migration_requested(environ: dict[str, str] | None = None) -> bool:
    """``RECON_LIMITS_MIGRATE=1``: this process's budgets replace the account's rows."""
    return settings(environ).limits_migrate


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
