"""The kinds of provider work, as data: the generic types, and a lookup over the providers' tables.

Everything that needs to know how a ``provider_kind`` behaves (its provider, whether it can be
recovered, how long before a row of that kind counts as stuck, how long the provider keeps its
media) reads it from here. The rows themselves belong to the providers: each provider package
declares a ``ProviderSpec`` (its kinds with their thresholds, its default budget, its settings) and
``recon_dagster/providers/registry.py`` lists the specs once. This module never names a provider
and never imports the providers layer: it loads the registry module by name on first use (as a
plugin host reads its entry points), so the layers contract holds and one list stays the truth.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from recon_dagster.config import Settings, declare_provider, settings

# Where the provider specs are listed (the only module that names every provider).
REGISTRY_MODULE = "recon_dagster.providers.registry"


@dataclass(frozen=True)
class ProviderKind:
    name: str
    # The provider's name (its package under recon_dagster/providers/, its resource's field).
    provider: str
    # Which endpoint and answer shape of the provider serves the kind (the provider's own names).
    family: str
    is_async: bool
    # A row whose provider call started longer ago than this is considered stuck (docs/design.md, "Kinds").
    stale_threshold: timedelta
    # How long the provider keeps a finished task's media reachable, where documented
    # (the providers' public docs). None: no signed URLs, or nothing to fetch.
    media_url_ttl: timedelta | None
    # How long a worker's own poll loop may wait for this kind before giving up.
    poll_budget: timedelta
    # Seconds between polls in a worker's poll loop.
    poll_interval_s: float
    # The provider may finish with a text result instead of media (the job's own job_type then says
    # whether media was promised); every other async kind always promises media.
    text_result: bool = False

    @property
    def recoverable(self) -> bool:
        """Only async kinds leave a task id behind to resume; sync calls can only be swept (D2)."""
        return self.is_async


def async_kind(
    name: str,
    provider: str,
    family: str,
    stale_min: int,
    ttl: timedelta | None,
    budget_min: int,
    interval_s: float = 5.0,
    *,
    text_result: bool = False,
) -> ProviderKind:
    """An async kind: thresholds in minutes (stale, the worker's poll budget), poll interval in s."""
    return ProviderKind(
        name,
        provider,
        family,
        True,
        timedelta(minutes=stale_min),
        ttl,
        timedelta(minutes=budget_min),
        interval_s,
        text_result,
    )


def sync_kind(name: str, provider: str, family: str) -> ProviderKind:
    """A synchronous kind: nothing to poll, swept after five minutes."""
    return ProviderKind(name, provider, family, False, timedelta(minutes=5), None, timedelta(minutes=5), 0.0)


@dataclass(frozen=True)
class Rate:
    """At most ``requests`` in any window of ``window_s`` seconds (a provider's published limit)."""

    requests: int
    window_s: float


@dataclass(frozen=True)
class ProviderSettings:
    """The environment variables a provider's resource is wired from (the providers' own names,
    not ``RECON_*``): its base URL (optional, default ``base_url``) and its key (a secret)."""

    title: str
    base_url: str
    base_url_env: str
    key_env: str
    key_doc: str
    base_url_note: str = ""
    # Other secrets of the provider's, each optional: (variable, what it is, the module reading it).
    extra_secrets: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class RunQueueLimits:
    """How many reconcile runs of the provider the deployment's run queue admits at once
    (``recon/provider`` tag) and, for its batch runs, its ``recon/provider_lane`` ``<name>/batch``
    limit (None: no batch lane limit). Checked against dagster.yaml and deploy/ by a test."""

    provider_runs: int
    batch_runs: int | None = None


@dataclass(frozen=True)
class DemoCase:
    """One row of ``recon-dagster demo``: a stuck job of ``kind`` and what its upstream task does
    (sandbox ``Scenario`` fields; None: no upstream task, e.g. a sync kind)."""

    label: str
    kind: str
    job_type: str
    minutes_stuck: float
    scenario: Mapping[str, Any] | None
    progress: int = 50
    cost: int = 10


@dataclass(frozen=True)
class ProviderSpec:
    """Everything the rest of the system needs to know about one provider, as plain data.

    ``resource`` and ``sandbox`` are ``"module:attribute"`` names, imported where they are used
    (the resource by ``providers/resource.py``; the sandbox plugin by the sandbox server), so the
    spec itself imports nothing but core.
    """

    name: str
    kinds: tuple[ProviderKind, ...]
    settings: ProviderSettings
    # The account's default budget (documented where the provider publishes one).
    reads: Rate | None
    creates: Rate | None
    concurrency: int | None
    limits_doc: str
    resource: str
    run_queue: RunQueueLimits
    demo: tuple[DemoCase, ...] = ()
    # Its poll parser ("module:function", see providers/parse.py); None for a provider with no
    # async kind.
    parser: str | None = None
    # The sandbox plugin ("module:attribute"), for providers whose sandbox lives in their package.
    sandbox: str | None = None
    # Why the defaults are what they are, shown in the generated settings docs.
    limits_shown: str = field(default="")

    @property
    def polled(self) -> bool:
        """Whether reconcile runs poll this provider (it has at least one async kind)."""
        return any(k.is_async for k in self.kinds)


class _Registry:
    """The providers' specs and their kinds, loaded once from ``REGISTRY_MODULE``."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loading = False
        self._specs: tuple[ProviderSpec, ...] | None = None
        self._kinds: dict[str, ProviderKind] = {}

    def specs(self) -> tuple[ProviderSpec, ...]:
        if self._specs is None:
            with self._lock:
                if self._specs is None:
                    if self._loading:
                        # A provider module asked for the table while the registry imports it.
                        raise RuntimeError(
                            f"{REGISTRY_MODULE} is still being imported: read kinds at call time"
                        )
                    self._loading = True
                    try:
                        module = importlib.import_module(REGISTRY_MODULE)
                    finally:
                        self._loading = False
                    specs: tuple[ProviderSpec, ...] = tuple(module.PROVIDERS)
                    kinds: dict[str, ProviderKind] = {}
                    for spec in specs:
                        for kind in spec.kinds:
                            if kind.name in kinds or kind.provider != spec.name:
                                raise RuntimeError(
                                    f"provider kind {kind.name!r} is declared twice or misfiled"
                                )
                            kinds[kind.name] = kind
                    for spec in specs:
                        _declare_settings(spec)
                    self._kinds = kinds
                    self._specs = specs
        return self._specs

    def kinds(self) -> dict[str, ProviderKind]:
        self.specs()
        return self._kinds


def _declare_settings(spec: ProviderSpec) -> None:
    s = spec.settings
    declare_provider(
        spec.name, title=s.title, base_url=s.base_url, base_url_env=s.base_url_env, key_env=s.key_env,
        key_doc=s.key_doc, base_url_note=s.base_url_note, limits_shown=spec.limits_shown,
        limits_doc=spec.limits_doc, extra_secrets=s.extra_secrets,
    )  # fmt: skip


_REGISTRY = _Registry()


def provider_specs() -> tuple[ProviderSpec, ...]:
    """Every provider's spec, in the registry's order."""
    return _REGISTRY.specs()


def provider_spec(name: str) -> ProviderSpec:
    """One provider's spec (``KeyError`` naming the known ones for an unknown name)."""
    for spec in provider_specs():
        if spec.name == name:
            return spec
    raise KeyError(f"unknown provider {name!r}; known: {', '.join(provider_names())}")


def provider_names() -> tuple[str, ...]:
    """Every provider's name, in the registry's order."""
    return tuple(s.name for s in provider_specs())


def polled_providers() -> tuple[str, ...]:
    """Providers whose kinds the reconcile runs poll (the others' kinds are synchronous: swept only)."""
    return tuple(s.name for s in provider_specs() if s.polled)


class _KindTable(Mapping[str, ProviderKind]):
    """``KINDS``: every provider's kinds by name, read from the registry on first use."""

    def __getitem__(self, name: str) -> ProviderKind:
        return _REGISTRY.kinds()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY.kinds())

    def __len__(self) -> int:
        return len(_REGISTRY.kinds())

    def __contains__(self, name: object) -> bool:
        return name in _REGISTRY.kinds()

    def __repr__(self) -> str:
        return f"KINDS({list(self)})"


KINDS: Mapping[str, ProviderKind] = _KindTable()


def kind_names() -> tuple[str, ...]:
    return tuple(KINDS)


# The derived tuples are computed from the registry when first asked for (not at import, so
# importing this module never loads the providers). The type checker sees them declared and no
# module ``__getattr__``, so a name this module does not define is still an error there.
if TYPE_CHECKING:
    KIND_NAMES: tuple[str, ...]
    ASYNC_KINDS: tuple[str, ...]
    SYNC_KINDS: tuple[str, ...]
    TEXT_RESULT_KINDS: frozenset[str]
else:

    def __getattr__(name: str) -> Any:
        if name == "KIND_NAMES":
            return tuple(KINDS)
        if name == "ASYNC_KINDS":
            return tuple(k.name for k in KINDS.values() if k.is_async)
        if name == "SYNC_KINDS":
            return tuple(k.name for k in KINDS.values() if not k.is_async)
        if name == "TEXT_RESULT_KINDS":
            return frozenset(k.name for k in KINDS.values() if k.text_result)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# A row whose provider call started under a provider_kind the registry does not know is swept
# after this long (it can never be polled).
LEGACY_STALE_THRESHOLD = timedelta(minutes=5)

# A row with no provider_call_started_at has not reached its provider call: it waits in the app's
# queue or in pre-call work (or is a pre-135 legacy row, which looks the same). During a backlog
# that wait is long and normal, so such a row is swept only after this budget, measured from
# COALESCE(started_at, created_at). RECON_PRECALL_BUDGET_S overrides it.
PRECALL_BUDGET = timedelta(seconds=Settings.precall_budget_s.default)


def precall_budget(environ: Mapping[str, str] | None = None) -> timedelta:
    """The pre-call budget: ``RECON_PRECALL_BUDGET_S`` seconds when set, else 3 hours.

    Raises ValueError naming the variable for anything but a finite positive number.
    """
    return timedelta(seconds=settings(environ).precall_budget_s)


# Job types that never call a provider themselves (spec 9.1: pipeline wrapper jobs deliberately
# carry no provider_kind). A row of these types with no provider_kind is not a legacy stuck call,
# so the sweep leaves it alone.
NON_PROVIDER_JOB_TYPES: tuple[str, ...] = ("pipeline",)

# 18 attempts x the 5-minute cadence ~= 90 minutes: covers kie-lip-sync's 75-minute threshold
# with 15 minutes of headroom before a job is presumed stuck rather than slow (spec 5.5).
MAX_ATTEMPTS = Settings.max_attempts.default
RECONCILE_CADENCE = timedelta(seconds=Settings.reconcile_cadence_s.default)


class UnknownProviderKind(ValueError):
    """A provider_kind value that is not in the registry."""

    def __init__(self, value: object) -> None:
        super().__init__(f"unknown provider_kind {value!r}; known kinds: {', '.join(KINDS)}")
        self.value = value


def get_kind(name: str | None) -> ProviderKind:
    """Look a kind up by name, with an error that lists the known ones."""
    if name is None or name not in KINDS:
        raise UnknownProviderKind(name)
    return KINDS[name]
