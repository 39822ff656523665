"""The registry of provider kinds: the design's table of kinds and thresholds, as data.

Everything that needs to know how a ``provider_kind`` behaves (its family, whether it can be
recovered, how long before a row of that kind counts as stuck, how long the provider keeps its
media) reads it from here. Adding a provider variant is one new ``ProviderKind`` row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from recon_dagster.config import Settings, settings


class Family(StrEnum):
    """Which provider resource serves a kind, and which response shape its poll returns."""

    KIE_MARKET = "kie-market"
    KIE_VEO = "kie-veo"
    KIE_SUNO = "kie-suno"
    KIE_KONTEXT = "kie-kontext"
    KIE_LUMA = "kie-luma"
    KIE_RUNWAY = "kie-runway"
    KIE_LLM = "kie-llm"
    REPLICATE_PREDICTION = "replicate-prediction"
    REPLICATE_TRAINING = "replicate-training"
    ELEVENLABS_DUBBING = "elevenlabs-dubbing"
    ELEVENLABS_TTS = "elevenlabs-tts"
    ANTHROPIC = "anthropic"


class Provider(StrEnum):
    KIE = "kie"
    REPLICATE = "replicate"
    ELEVENLABS = "elevenlabs"
    ANTHROPIC = "anthropic"


@dataclass(frozen=True)
class ProviderKind:
    name: str
    provider: Provider
    family: Family
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

    @property
    def recoverable(self) -> bool:
        """Only async kinds leave a task id behind to resume; sync calls can only be swept (D2)."""
        return self.is_async


def _async(
    name: str,
    provider: Provider,
    family: Family,
    stale_min: int,
    ttl: timedelta | None,
    budget_min: int,
    interval_s: float = 5.0,
) -> ProviderKind:
    return ProviderKind(
        name,
        provider,
        family,
        True,
        timedelta(minutes=stale_min),
        ttl,
        timedelta(minutes=budget_min),
        interval_s,
    )


def _sync(name: str, provider: Provider, family: Family) -> ProviderKind:
    return ProviderKind(name, provider, family, False, timedelta(minutes=5), None, timedelta(minutes=5), 0.0)


# KIE documents 14 days of media retention in general but one endpoint says result URLs
# "typically expire after 24 hours"; the shorter is taken as true.
KIE_MEDIA_TTL = timedelta(hours=24)
# Replicate deletes API-created outputs one hour after completion.
REPLICATE_MEDIA_TTL = timedelta(hours=1)

_KINDS: tuple[ProviderKind, ...] = (
    _async("kie-standard", Provider.KIE, Family.KIE_MARKET, 10, KIE_MEDIA_TTL, 18),
    _async("kie-veo", Provider.KIE, Family.KIE_VEO, 25, KIE_MEDIA_TTL, 20),
    _async("kie-suno", Provider.KIE, Family.KIE_SUNO, 30, KIE_MEDIA_TTL, 25),
    _async("kie-kontext", Provider.KIE, Family.KIE_KONTEXT, 10, KIE_MEDIA_TTL, 8),
    _async("kie-luma", Provider.KIE, Family.KIE_LUMA, 25, KIE_MEDIA_TTL, 20),
    _async("kie-kling3", Provider.KIE, Family.KIE_MARKET, 25, KIE_MEDIA_TTL, 20),
    _async("kie-runway", Provider.KIE, Family.KIE_RUNWAY, 25, KIE_MEDIA_TTL, 20),
    _async("kie-lip-sync", Provider.KIE, Family.KIE_MARKET, 75, KIE_MEDIA_TTL, 60, 10.0),
    _sync("kie-llm", Provider.KIE, Family.KIE_LLM),
    _async(
        "replicate-prediction",
        Provider.REPLICATE,
        Family.REPLICATE_PREDICTION,
        20,
        REPLICATE_MEDIA_TTL,
        15,
        2.0,
    ),
    _async(
        "replicate-training", Provider.REPLICATE, Family.REPLICATE_TRAINING, 30, REPLICATE_MEDIA_TTL, 60, 10.0
    ),
    _async("elevenlabs-async", Provider.ELEVENLABS, Family.ELEVENLABS_DUBBING, 15, None, 15),
    _sync("elevenlabs-sync", Provider.ELEVENLABS, Family.ELEVENLABS_TTS),
    _sync("anthropic-sync", Provider.ANTHROPIC, Family.ANTHROPIC),
)

KINDS: dict[str, ProviderKind] = {k.name: k for k in _KINDS}
KIND_NAMES: tuple[str, ...] = tuple(KINDS)
ASYNC_KINDS: tuple[str, ...] = tuple(k.name for k in _KINDS if k.is_async)
SYNC_KINDS: tuple[str, ...] = tuple(k.name for k in _KINDS if not k.is_async)

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

# Async kinds whose provider may finish with a text result instead of media (KIE market text models
# answer ``resultObject``; Replicate runs language models too). For these the job's own job_type
# says whether media was promised; every other async kind always promises media.
TEXT_RESULT_KINDS: frozenset[str] = frozenset({"kie-standard", "replicate-prediction"})

# 18 attempts x the 5-minute cadence ~= 90 minutes: covers kie-lip-sync's 75-minute threshold
# with 15 minutes of headroom before a job is presumed stuck rather than slow (spec 5.5).
MAX_ATTEMPTS = Settings.max_attempts.default
RECONCILE_CADENCE = timedelta(seconds=Settings.reconcile_cadence_s.default)


class UnknownProviderKind(ValueError):
    """A provider_kind value that is not in the registry."""

    def __init__(self, value: object) -> None:
        super().__init__(f"unknown provider_kind {value!r}; known kinds: {', '.join(KIND_NAMES)}")
        self.value = value


def get_kind(name: str | None) -> ProviderKind:
    """Look a kind up by name, with an error that lists the known ones."""
    if name is None or name not in KINDS:
        raise UnknownProviderKind(name)
    return KINDS[name]
