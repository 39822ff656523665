"""A media download from a provider's own API (ElevenLabs' dubbed audio) is a request on the
account's key: it holds one of the account's concurrency slots for as long as the bytes flow, as a
poll does, so the account's concurrency limit counts it (issue 49). A public media URL holds none.
Real PostgreSQL slots, the loopback sandbox dripping the bytes, the reconciler as the op builds it."""

from __future__ import annotations

import secrets
import threading
import time
from datetime import timedelta

from recon_dagster.db import jobs as jobs_db
from recon_dagster.defs.resources import ReconcileSettingsResource
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.providers.status import MediaRef
from recon_dagster.reconcile.reconciler import Reconciler
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row
from recon_dagster_tests.support.ledger import held_slots
from recon_dagster_tests.support.reconcile import stale_job_with_task


def _most_slots_while(db, account: str, work) -> int:
    """Run ``work`` in a thread; the most account slots seen held while it ran."""
    most = 0
    t = threading.Thread(target=work)
    t.start()
    while t.is_alive():
        most = max(most, held_slots(db, account))
        time.sleep(0.02)
    t.join()
    return most


def _reconcile(db, media_dir, job, providers, *, with_slot: bool = True):
    policy = ReconcileSettingsResource().media_policy(
        providers.media_headers, providers.media_slot if with_slot else None
    )
    with db.begin() as conn:
        assert jobs_db.claim_jobs(conn, [jobs_db.Claim(job, 0)], "run-1", timedelta(minutes=15))
    rec = Reconciler(db, providers, LocalMediaStore(base_dir=media_dir), media_policy=policy)
    out: list = []
    return out, lambda: out.append(rec.reconcile(job, "run-1"))


def test_an_authenticated_download_holds_an_account_slot_while_its_bytes_flow(
    db, media_dir, sandbox, monkeypatch
) -> None:
    account = f"media-{secrets.token_hex(4)}"
    monkeypatch.setenv("RECON_LIMITS", "database")
    monkeypatch.setenv("RECON_LIMIT_ELEVENLABS", f"account={account},concurrency=2")
    monkeypatch.setenv("RECON_MEDIA_ALLOWED_HOSTS", "127.0.0.1")
    # 300 bytes dripped one every 5 ms: the download lasts a second or two.
    _, job, _ = stale_job_with_task(
        db, sandbox, "elevenlabs-async",
        Scenario(polls_before_done=0, media_size=300, media_drip_s=0.005), job_type="audio",
    )  # fmt: skip
    providers = providers_from_env()
    out, work = _reconcile(db, media_dir, job, providers)

    most = _most_slots_while(db, account, work)

    assert out and out[0].outcome.value == "recovered", out
    assert job_row(db, job)["status"] == "completed"
    assert most == 1  # before: 0 (the key was let out, the slot released before the download)
    assert held_slots(db, account) == 0  # released when the download ended


def test_a_public_media_url_holds_no_account_slot_and_a_provider_url_one(db, sandbox, monkeypatch) -> None:
    account = f"media-{secrets.token_hex(4)}"
    monkeypatch.setenv("RECON_LIMITS", "database")
    monkeypatch.setenv("RECON_LIMIT_ELEVENLABS", f"account={account},concurrency=2")
    providers = providers_from_env()
    task = sandbox.add_task("elevenlabs-async", Scenario(polls_before_done=0))
    (own,) = providers.poll("elevenlabs-async", task).media
    assert own.needs_auth
    public = MediaRef(url="https://cdn.example.com/a.mp3", kind=own.kind, needs_auth=False)

    with providers.media_slot("elevenlabs-async", public):
        assert held_slots(db, account) == 0
    with providers.media_slot("elevenlabs-async", own):
        assert held_slots(db, account) == 1
    assert held_slots(db, account) == 0
