"""Delivering one tick's alerts within the tick's own deadline, whatever the targets do.

Each target gets its deliveries in order (what it was owed first, then the tick's new alerts: a
trigger always before its resolve), on a thread of its own, so a target that never answers holds
up nobody else. Each request's timeout is the target's timeout cut to what is left of the tick's
deadline; no request starts past it. A target's first failure in a tick ends its turn: the
delivery that failed counts one try, the ones behind it wait untried for the next tick. What was
not delivered is owed, kept in the sensor's cursor with its try count.

A target that fails ``max_tries`` tries in a row on the same delivery is given up on: everything
it is owed is dropped, with one line saying so (its next alerts are tried afresh). Past
``max_owed`` deliveries owed in all, the oldest are dropped, with one line saying how many.

A delivery is acknowledged only by the target's answer: one still unanswered when the tick ends
stays owed (at-least-once: a target that answers after its timeout may get it twice; a target
that answers in time never does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field
from typing import Any

import httpx

from recon_dagster.alerting.incidents import Alert
from recon_dagster.alerting.targets import DeliveryError, Target
from recon_dagster.telemetry.instruments import ALERT_DELIVERIES

# No request starts with less than this left of the tick's deadline.
MIN_REQUEST_S = 0.5
# The tick waits this long past its deadline for a thread whose request overran it.
GRACE_S = 1.0


@dataclass
class Owed:
    """One alert owed to one target, and how many tries it has failed."""

    alert: Alert
    target: str
    tries: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"alert": self.alert.as_json(), "target": self.target, "tries": self.tries}


@dataclass
class Outcome:
    """What one tick's deliveries did."""

    delivered: list[Owed] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # target -> its error this tick
    owed: list[Owed] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)  # one line per target given up on
    dropped: int = 0  # owed deliveries dropped past ``max_owed``


def deliver_within(
    queue: Sequence[Owed],
    targets: Sequence[Target],
    *,
    timeout_s: float,
    deadline: float,
    client: Callable[[], httpx.Client],
    max_tries: int,
    max_owed: int,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Deliver ``queue`` (oldest first) by ``deadline`` (``clock`` time); see the module's text."""
    by_name = {t.name: t for t in targets}
    lanes: dict[str, list[Owed]] = {}
    out = Outcome()
    for item in queue:
        if item.target in by_name:  # a target no longer configured is owed nothing
            lanes.setdefault(item.target, []).append(item)
    done: set[int] = set()
    lock = threading.Lock()

    def lane(name: str, items: list[Owed]) -> None:
        target = by_name[name]
        with client() as http:
            for item in items:
                left = deadline - clock()
                if left < MIN_REQUEST_S:
                    return
                try:
                    target.send(http, item.alert, timeout_s=min(timeout_s, left))
                except DeliveryError as exc:
                    ALERT_DELIVERIES.add(1, target=name, action=item.alert.action, result="failed")
                    with lock:
                        item.tries += 1
                        out.failed[name] = str(exc)
                    return
                ALERT_DELIVERIES.add(1, target=name, action=item.alert.action, result="delivered")
                with lock:
                    done.add(id(item))
                    out.delivered.append(item)

    if lanes:
        pool = ThreadPoolExecutor(max_workers=len(lanes), thread_name_prefix="alert-delivery")
        futures = [pool.submit(lane, name, items) for name, items in lanes.items()]
        wait_all(futures, timeout=max(0.0, deadline - clock()) + GRACE_S)
        pool.shutdown(wait=False)  # a request past its timeout does not hold the tick
    kept: set[int] = set()
    with lock:
        for name, items in lanes.items():
            left = [i for i in items if id(i) not in done]
            if name in out.failed and left and left[0].tries >= max_tries:
                out.given_up.append(
                    f"gave up on {name} after {left[0].tries} failed tries: dropped {len(left)} owed "
                    f"alert(s) ({out.failed[name]})"
                )
                continue
            kept.update(id(i) for i in left)
    out.owed = [i for i in queue if id(i) in kept]  # oldest first, as queued
    if len(out.owed) > max_owed:
        out.dropped = len(out.owed) - max_owed
        out.owed = out.owed[-max_owed:]
    return out
