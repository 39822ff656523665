"""Issue 34's rules probed with variants the first tests did not cover (an external reviewer's
re-run): a request this process never sent is not an attempt, whichever of its own limits kept
it in; a refusal takes nothing from the account.
"""

from __future__ import annotations

import threading
import time

import pytest

from recon_dagster.providers import providers_from_env
from recon_dagster.providers.status import NotSent, NotSentReason
from recon_dagster.sandbox import Scenario

pytestmark = pytest.mark.timeout(60)


def test_a_poll_that_waits_past_its_deadline_for_the_process_cap_is_not_sent(sandbox, monkeypatch) -> None:
    """The process's own concurrency cap (``max_concurrency``) is full for longer than a poll's
    deadline: the poll is not sent (``slot_wait_past_deadline``) at its deadline, instead of
    waiting on and then going out with what is left of it (1 ms timeouts: a counted attempt)."""
    monkeypatch.setenv("RECON_LIMITS", "process")

    def kie(deadline_s: float):  # noqa: ANN202 - its own client, the process's one semaphore
        return providers_from_env().kie.model_copy(update={"max_concurrency": 1, "read_deadline_s": deadline_s})

    slow = sandbox.add_task("kie-standard", Scenario(latency_s=3.0, outcome="run_forever"))
    fast = sandbox.add_task("kie-standard", Scenario(outcome="run_forever"))
    inside = threading.Thread(target=kie(10.0).poll, args=("kie-standard", slow))
    inside.start()
    try:
        time.sleep(0.5)  # the slow poll holds the process's only slot
        impatient = kie(1.0)
        started = time.monotonic()
        with pytest.raises(NotSent) as caught:
            impatient.poll("kie-standard", fast)
        assert caught.value.reason is NotSentReason.SLOT_WAIT
        assert time.monotonic() - started < 2.0  # at its deadline, not when the slot came free
        assert sandbox.poll_count(fast) == 0
    finally:
        inside.join(15)
