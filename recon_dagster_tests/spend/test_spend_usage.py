"""ElevenLabs' and Anthropic's spend, and the day's summary, on real PostgreSQL against the sandbox
over HTTP, materialized in-process: characters nobody charged, a wrong count, a charge the
provider never saw; tokens nobody recorded, judged only after the usage report's delay; no admin
key, no request and no red."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.config import Settings
from recon_dagster.defs.spend.assets import anthropic_spend, elevenlabs_spend, spend_assets
from recon_dagster.defs.spend.hourly import anthropic_spend_hourly, hour_turned_final
from recon_dagster.defs.spend.summary import spend_summary
from recon_dagster.providers import ProviderHTTPError, ProvidersResource, providers_from_env
from recon_dagster.providers.anthropic.spend import AnthropicUsageResource
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support.spend import back_date, charged_job, reconcile, resources, yesterday

TTS = "elevenlabs-sync"


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def speak(providers: ProvidersResource, text: str) -> tuple[str, int]:
    """A text-to-speech call through the resource's client; what its answer's headers say was
    billed (the request id and the characters), as the app's worker records them."""
    response = providers.elevenlabs.http.request(
        "POST", "/v1/text-to-speech/voice-1", label=TTS, idempotent=False, json={"text": text}
    )
    return response.headers["request-id"], int(response.headers["x-character-count"])


def test_elevenlabs_names_characters_nobody_charged_a_wrong_count_and_a_charge_it_never_billed(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    right_id, right = speak(providers, "Hello there, listener.")
    charged_job(db, user, TTS, characters=right, request_id=right_id)
    short_id, short = speak(providers, "A sentence recorded shorter than it was billed.")
    charged_job(db, user, TTS, characters=short - 10, request_id=short_id)
    nobody_id, nobody = speak(providers, "Spoken, never charged.")
    ghost = charged_job(db, user, TTS, characters=7, request_id="request-never-made")
    back_date(db, sandbox)

    done = reconcile(elevenlabs_spend, instance, resources(providers, sandbox))

    assert done.named() == {
        ("characters_nobody_charged", nobody_id),
        ("characters_differ", short_id),
        ("charged_without_request", "request-never-made"),
    }
    by_id = {n["id"]: n for n in done.value("named")}
    assert by_id["request-never-made"]["job_id"] == str(ghost)
    billed, ours = right + short + nobody, right + (short - 10) + 7
    assert (done.value("provider_amount"), done.value("our_amount")) == (billed, ours)
    assert done.value("breakdown/history_characters") == billed
    assert not done.check.passed


def anthropic_call(providers: ProvidersResource, model: str, text: str) -> tuple[int, int]:
    answer = providers.anthropic.messages(model, [{"role": "user", "content": text}], 64)
    return answer["usage"]["input_tokens"], answer["usage"]["output_tokens"]


def seed_anthropic_day(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> int:
    """Two recorded calls and one nobody recorded (its tokens: the difference)."""
    for text in ("Summarise the day.", "Name three rivers."):
        tokens_in, tokens_out = anthropic_call(providers, "claude-a", text)
        charged_job(
            db, user, "anthropic-sync", model="claude-a", input_tokens=tokens_in, output_tokens=tokens_out
        )
    tokens_in, tokens_out = anthropic_call(providers, "claude-b", "Nobody records this call.")
    back_date(db, sandbox)
    return tokens_in + tokens_out


def test_anthropic_tokens_nobody_recorded_are_provisional_inside_the_lag_window_and_red_after(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    unrecorded = seed_anthropic_day(db, sandbox, providers, user)
    # Yesterday ended less than a day ago: inside the default delay, the report is not final.
    inside = reconcile(anthropic_spend, instance, resources(providers, sandbox))
    assert inside.value("final") is False and inside.check.passed
    assert inside.named() == {("tokens_nobody_recorded", "claude-b")}
    assert inside.value("difference") == unrecorded

    monkeypatch.setenv(Settings.spend_anthropic_final_after_s.name, "60")
    after = reconcile(anthropic_spend, instance, resources(providers, sandbox))
    assert after.value("final") is True and not after.check.passed
    assert after.named() == {("tokens_nobody_recorded", "claude-b")}

    monkeypatch.setenv(Settings.spend_anthropic_tolerance_tokens.name, str(unrecorded))
    assert reconcile(anthropic_spend, instance, resources(providers, sandbox)).check.passed


def test_anthropic_calls_the_report_has_not_exported_yet_show_as_not_billed_until_final(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    seed_anthropic_day(db, sandbox, providers, user)
    sandbox.sandbox.state.spend["anthropic_report_lag_s"] = 2 * 86_400.0  # nothing exported yet

    lagging = reconcile(anthropic_spend, instance, resources(providers, sandbox))

    assert lagging.value("provider_amount") == 0
    assert lagging.named() == {("tokens_not_billed", "claude-a")}
    assert lagging.value("final") is False and lagging.check.passed


def test_without_an_admin_key_anthropic_is_not_configured_asks_nothing_and_stays_green(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    seed_anthropic_day(db, sandbox, providers, user)
    reads_before = len(sandbox.request_times("anthropic", "read"))

    done = reconcile(anthropic_spend, instance, resources(providers, sandbox, admin_key=False))

    assert done.value("configured") is False and done.check.passed
    assert "not configured" in (done.check.description or "")
    assert len(sandbox.request_times("anthropic", "read")) == reads_before


def test_the_days_summary_plots_every_providers_figures_as_numbers(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    speak(providers, "Billed, never charged.")
    back_date(db, sandbox)
    result = dg.materialize(
        [*spend_assets, spend_summary], partition_key=yesterday(), instance=instance,
        resources=resources(providers, sandbox),
    )  # fmt: skip
    assert result.success
    [summary] = result.asset_materializations_for_node("spend_summary")
    meta = summary.metadata
    assert meta["missing"].value == "none"
    for provider in ("replicate", "elevenlabs", "anthropic", "kie"):
        for series in ("provider_amount", "our_amount", "difference", "our_cost_usd"):
            assert isinstance(meta[f"{series}/{provider}"], dg.FloatMetadataValue), (series, provider)
        assert isinstance(meta[f"findings/{provider}"], dg.IntMetadataValue)
    assert meta["provider_amount/elevenlabs"].value == len("Billed, never charged.")
    assert meta["with_findings"].value == "elevenlabs"


def test_history_and_the_usage_report_are_read_to_their_last_page(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    spoken = [speak(providers, f"line number {n}") for n in range(5)]
    seed_anthropic_day(db, sandbox, providers, user)
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    end = start + timedelta(days=1)

    items = list(providers.elevenlabs.history(start, end, page_size=2))
    assert sorted(i.request_id or "" for i in items) == sorted(r for r, _ in spoken)
    assert len(sandbox.request_times("elevenlabs", "read")) == 3  # pages of 2, 2 and 1

    usage = AnthropicUsageResource(
        base_url=sandbox.api_base_url("anthropic"), api_key=sandbox.sandbox.api_key, report_page_hours=5
    )
    reads = len(sandbox.request_times("anthropic", "read"))
    buckets = usage.usage_report(start, end)
    assert len(sandbox.request_times("anthropic", "read")) - reads == 5  # 24 hours, 5 a page
    assert {b.model for b in buckets} == {"claude-a", "claude-b"}
    assert {b.api_key_id for b in buckets} == {"apikey_sandbox"}


@pytest.mark.parametrize(
    "at, delay_s, hour",
    [
        ("2026-11-03T10:15:00", 3600, "2026-11-03-08:00"),  # 09:00-10:00 becomes final at 11:00
        ("2026-11-03T10:15:00", 0, "2026-11-03-09:00"),
        ("2026-11-03T00:15:00", 86_400, "2026-11-01-23:00"),
    ],
)
def test_the_hourly_schedule_asks_for_the_hour_that_just_became_final(
    at: str, delay_s: float, hour: str
) -> None:
    assert hour_turned_final(datetime.fromisoformat(at).replace(tzinfo=UTC), delay_s) == hour


def test_one_hour_of_anthropic_usage_is_judged_on_its_own_once_final(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    now = datetime.now(UTC)
    unrecorded = seed_anthropic_day(db, sandbox, providers, user)
    into_the_hour = now.minute * 60 + now.second
    back_date(db, sandbox, seconds=into_the_hour - 1800.0)  # the seeded calls at half past, a day ago
    hour = (now - timedelta(days=1)).strftime("%Y-%m-%d-%H:00")
    monkeypatch.setenv(Settings.spend_anthropic_final_after_s.name, "60")

    done = reconcile(anthropic_spend_hourly, instance, resources(providers, sandbox), partition=hour)

    assert done.named() == {("tokens_nobody_recorded", "claude-b")}
    assert done.value("difference") == unrecorded and not done.check.passed
    before = (now - timedelta(days=1, hours=1)).strftime("%Y-%m-%d-%H:00")
    empty = reconcile(anthropic_spend_hourly, instance, resources(providers, sandbox), partition=before)
    assert empty.value("provider_amount") == 0 and empty.check.passed


def test_a_wrong_admin_key_fails_the_read_with_the_key_masked(sandbox: SandboxServer) -> None:
    wrong = "sk-ant-admin01-wrong-key-7f3a9c"
    usage = AnthropicUsageResource(base_url=sandbox.api_base_url("anthropic"), api_key=wrong)
    start = datetime(2026, 11, 3, tzinfo=UTC)
    with pytest.raises(ProviderHTTPError) as caught:
        usage.usage_report(start, start + timedelta(days=1))
    assert caught.value.status_code == 401
    assert wrong not in str(caught.value)
