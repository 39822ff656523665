"""The provider-kind registry against a table written out here (async or sync, stale threshold) and
the providers' documented media lifetimes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from recon_dagster.core.kinds import (
    ASYNC_KINDS,
    KINDS,
    MAX_ATTEMPTS,
    RECONCILE_CADENCE,
    SYNC_KINDS,
    UnknownProviderKind,
    get_kind,
)

# The registry as designed, written out independently of kinds.py: kind -> (async?, stale
# threshold in minutes).
EXPECTED_TABLE = {
    "kie-standard": (True, 10),
    "kie-veo": (True, 25),
    "kie-suno": (True, 30),
    "kie-kontext": (True, 10),
    "kie-luma": (True, 25),
    "kie-kling3": (True, 25),
    "kie-runway": (True, 25),
    "kie-lip-sync": (True, 75),
    "kie-llm": (False, 5),
    "replicate-prediction": (True, 20),
    "replicate-training": (True, 30),
    "elevenlabs-async": (True, 15),
    "elevenlabs-sync": (False, 5),
    "anthropic-sync": (False, 5),
    "fal-image": (True, 10),
    "fal-video": (True, 30),
}


def test_there_are_the_sixteen_spec_kinds() -> None:
    assert len(KINDS) == 16
    assert set(KINDS) == set(EXPECTED_TABLE)


def test_sync_kinds_are_exactly_the_three_single_roundtrip_ones() -> None:
    assert set(SYNC_KINDS) == {"kie-llm", "elevenlabs-sync", "anthropic-sync"}
    assert set(ASYNC_KINDS) == set(KINDS) - set(SYNC_KINDS)
    for name in SYNC_KINDS:
        assert not get_kind(name).recoverable, name


@pytest.mark.parametrize("name", sorted(EXPECTED_TABLE))
def test_kind_matches_spec_table(name: str) -> None:
    is_async, stale_min = EXPECTED_TABLE[name]
    kind = get_kind(name)
    assert kind.name == name
    assert kind.is_async is is_async
    assert kind.recoverable is is_async
    assert kind.stale_threshold == timedelta(minutes=stale_min)


def test_stale_threshold_is_at_most_half_the_media_ttl() -> None:
    # Media URLs expire (Replicate 1 h, KIE 24 h): a row must be picked up while its media can
    # still be fetched, with the other half of the TTL left for retries (design rule).
    checked = 0
    for kind in KINDS.values():
        if kind.recoverable and kind.media_url_ttl is not None:
            assert kind.stale_threshold <= kind.media_url_ttl / 2, (
                f"{kind.name}: threshold {kind.stale_threshold} > half of TTL {kind.media_url_ttl}"
            )
            checked += 1
    assert checked >= 10  # every KIE and Replicate kind has a TTL; the rule was really applied


def test_known_media_ttls() -> None:
    assert get_kind("replicate-prediction").media_url_ttl == timedelta(hours=1)
    assert get_kind("replicate-training").media_url_ttl == timedelta(hours=1)
    assert get_kind("kie-veo").media_url_ttl == timedelta(hours=24)


def test_attempt_cap_outlasts_the_longest_threshold() -> None:
    longest = max(k.stale_threshold for k in KINDS.values())
    assert MAX_ATTEMPTS == 18
    assert longest + timedelta(minutes=15) <= MAX_ATTEMPTS * RECONCILE_CADENCE


@pytest.mark.parametrize("value", ["kie-unknown", "", "KIE-STANDARD", None])
def test_get_kind_on_unknown_value_names_it(value: str | None) -> None:
    with pytest.raises(UnknownProviderKind) as err:
        get_kind(value)
    assert repr(value) in str(err.value)
    assert err.value.value == value
    assert "kie-standard" in str(err.value)  # lists the known kinds
