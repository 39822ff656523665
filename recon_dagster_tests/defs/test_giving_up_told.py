"""Giving up is never quiet (issue 55, item 4): each new force-fail at the attempt cap is told,
while the cap's incident is already open: the alert is sent again (same incident, same PagerDuty
dedup key) with the running count over the check's window and the kinds, never only the last run's.
"""

from __future__ import annotations

import pytest

from recon_dagster.alerting.incidents import IncidentBook, Signal
from recon_dagster.core.kinds import MAX_ATTEMPTS
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.defs.test_alerts import AlertTicks, _targets, receivers  # noqa: F401
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

KEY = "check:credit_anomalies:no_new_exhausted_jobs"


def test_an_open_incident_is_told_again_only_when_something_new_failed():
    book = IncidentBook()
    assert [a.action for a in book.observe(Signal(KEY, True, "t", "1 job", 0, news="7"))] == ["trigger"]
    assert book.observe(Signal(KEY, True, "t", "1 job", 1, news="7")) == []  # the same force-fail, read again
    assert book.observe(Signal(KEY, True, "t", "1 job", 1)) == []  # a signal with nothing new
    [again] = book.observe(Signal(KEY, True, "t", "2 jobs", 2, news="9"))
    assert (again.action, again.key, again.summary) == ("trigger", KEY, "2 jobs")
    assert [a.action for a in book.observe(Signal(KEY, False, "t", "none", 3))] == ["resolve"]


@pytest.mark.slow
def test_each_new_force_fail_at_the_cap_is_told_with_the_windows_count_and_kinds(
    db,
    instance,
    media_dir,
    sandbox,
    receivers,  # noqa: F811
):
    defs = make_defs(media_dir, cadence_seconds=0, single_run_below=5)
    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    ticks()
    running = Scenario(outcome="run_forever")
    stale_job_with_task(db, sandbox, "replicate-prediction", running, attempts=MAX_ATTEMPTS - 1)
    tick(defs, instance)
    ticks()
    stale_job_with_task(db, sandbox, "fal-image", running, attempts=MAX_ATTEMPTS - 1)
    stale_job_with_task(db, sandbox, "fal-image", running, attempts=MAX_ATTEMPTS - 1)
    tick(defs, instance)
    ticks()
    ticks()  # nothing new: nothing sent

    told = [r.json for r in receivers.accepted("/hook/") if r.json["key"] == KEY]
    # One trigger per run that gave up on a job (single-job runs here), the last with the window's count.
    assert [t["action"] for t in told] == ["trigger"] * 3, ticks.messages
    assert "1 job(s) force-failed at the attempt cap and refunded in the last 30 min" in told[0]["summary"]
    assert "replicate-prediction 1" in told[0]["summary"]
    assert "3 job(s) force-failed at the attempt cap and refunded in the last 30 min" in told[-1]["summary"]
    assert "fal-image 2, replicate-prediction 1" in told[-1]["summary"]
