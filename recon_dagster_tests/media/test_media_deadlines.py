"""Every media transfer ends within its overall deadline, well inside the reconcile lease, however
slowly the server drips its bytes. Real HTTP to the sandbox, real PostgreSQL.

Short deadlines come from the environment (``RECON_MEDIA_DEADLINE_S``) or the settings resource;
pytest-timeout guards against a hang.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from recon_dagster.core.deadlines import MEDIA_FLOOR_S, sized_deadline_s
from recon_dagster.media.errors import MediaFetchError
from recon_dagster.media.folder import FolderWriter
from recon_dagster.media.transfer import fetch_bytes, fetch_to_store
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, tick, usage_status

pytestmark = pytest.mark.timeout(90)

# 64 KiB at one byte per 0.2 s would take about 3.6 hours.
DRIP_MEDIA = Scenario(polls_before_done=0, media_kind="video", media_drip_s=0.2)


def _everything(folder: str) -> list[Path]:
    return [p for p in Path(folder).rglob("*") if p.is_file()]


@pytest.mark.slow
def test_a_dripping_download_into_the_store_stops_at_the_deadline(sandbox, tmp_path):
    task = sandbox.add_task("kie-standard", DRIP_MEDIA)
    store = FolderWriter(tmp_path)

    started = time.monotonic()
    with pytest.raises(MediaFetchError, match="deadline"):
        fetch_to_store(sandbox.media_url(task), store, "images/x/0.png", max_bytes=1 << 20, deadline_s=1.5)
    assert time.monotonic() - started < 1.5 + 5
    assert _everything(str(tmp_path)) == []  # all-or-nothing: no object, no part file


@pytest.mark.slow
def test_a_dripping_image_fetch_stops_at_the_deadline(sandbox):
    task = sandbox.add_task("kie-standard", DRIP_MEDIA)
    with pytest.raises(MediaFetchError, match="deadline"):
        fetch_bytes(sandbox.media_url(task), max_bytes=1 << 20, deadline_s=1.5)


@pytest.mark.parametrize("every_s", [1.0, 8.0], ids=["a-byte-a-second", "a-byte-every-8-s"])
@pytest.mark.slow
def test_a_body_dripped_slowly_ends_at_the_deadline_not_at_its_next_byte(sandbox, every_s):
    """The body's reads run under the download's deadline, so the read in
    progress ends at the deadline (the 30 s read timeout never fires against a drip, and the
    check between chunks only runs when the next byte comes). On main at 4786a20 both ended at
    the first byte after the deadline: 3 s and 8 s, 'download deadline passed after N bytes'."""
    deadline = 2.5
    task = sandbox.add_task(
        "kie-standard", Scenario(polls_before_done=0, media_kind="video", media_drip_s=every_s)
    )

    started = time.monotonic()
    with pytest.raises(
        MediaFetchError, match=r"reading body failed: ReadTimeout: overall deadline of 2.5 s passed"
    ):
        fetch_bytes(sandbox.media_url(task), max_bytes=1 << 20, deadline_s=deadline)
    assert time.monotonic() - started < deadline + 2.0


def test_reconcile_counts_an_attempt_when_the_media_drips_past_the_deadline(
    db, instance, media_dir, sandbox, monkeypatch
):
    monkeypatch.setenv("RECON_MEDIA_DEADLINE_S", "2")
    user = make_user(db)
    task = sandbox.add_task("kie-standard", DRIP_MEDIA)
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=30)
    reserve(db, job, user, 30)

    started = time.monotonic()
    report = tick(make_defs(media_dir), instance)

    assert time.monotonic() - started < 60  # the download alone would take hours
    row = job_row(db, job)
    assert row["status"] == "processing" and row["reconcile_attempts"] == 1
    assert "deadline" in row["reconcile_last_error"]
    assert usage_status(db, job) == "reserved"
    assert report.summary.errors == 1
    assert _everything(media_dir) == []


def test_the_settings_resource_deadline_applies_too(db, instance, media_dir, sandbox):
    user = make_user(db)
    task = sandbox.add_task("kie-standard", DRIP_MEDIA)
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=30)
    reserve(db, job, user, 30)

    tick(make_defs(media_dir, media_deadline_seconds=1.5), instance)

    assert "deadline" in job_row(db, job)["reconcile_last_error"]


def test_a_declared_size_gets_its_share_of_the_budget_never_more():
    mib = 1024 * 1024
    assert sized_deadline_s(None, 600, mib) == 600  # unknown size: the whole budget left
    assert sized_deadline_s(10 * mib, 600, mib) == MEDIA_FLOOR_S + 10
    assert sized_deadline_s(2048 * mib, 600, mib) == 600  # a 2 GiB video: capped by the budget
    assert sized_deadline_s(10 * mib, 5, mib) == 5  # what an earlier object left over
    assert sized_deadline_s(10 * mib, 600, None) == 600


def test_a_media_host_that_never_answers_names_the_timeout_that_ran_out(tmp_path):
    """A bare "ReadTimeout: timed out" says nothing of which timeout; the reason names it."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # accept and say nothing
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    try:
        with pytest.raises(MediaFetchError) as caught:
            fetch_to_store(
                f"http://127.0.0.1:{port}/m/0.png", FolderWriter(tmp_path), "images/x/0.png",
                max_bytes=1 << 20, timeout_s=0.5, allowed_hosts=frozenset({f"127.0.0.1:{port}"}),
            )  # fmt: skip
    finally:
        stop.set()
        thread.join()
        for s in held:
            s.close()
        server.close()
    assert "no answer within the 0.5 s media timeout" in str(caught.value), caught.value
