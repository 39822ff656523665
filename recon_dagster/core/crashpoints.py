"""Named crash points: ``crash_point("finalize.in_settle")`` SIGKILLs this process when armed.

This module ships in the package (not in the tests) because the fault harness
(``benchmarks/chaos.py``, ``recon_dagster_tests/chaos/``) drives real subprocesses (an app worker,
``recon-dagster reconcile --once``) and needs them to die at an exact place. Unarmed, a call is
one global lookup and a ``None`` test: the environment is read once, on the first call.

Arming, all through the environment of the process to kill:

* ``RECON_CRASH_AT``: the point name (or several, comma-separated). Unset: every call is a no-op.
* ``RECON_CRASH_HITS`` (default 1): die on the n-th time an armed point is reached (counted over
  all armed points and threads of the process).
* ``RECON_CRASH_HOLD`` (``1``/``0``, default 0): hits before the n-th block for ever instead of
  passing, so with n concurrent jobs every one of them is caught exactly at the point when the
  process dies (the harness's "every job is a trial").
* ``RECON_CRASH_PROB`` (default 1) and ``RECON_CRASH_SEED``: count a hit only with this
  probability (seeded, reproducible), to land the kill at a random occurrence.
* ``RECON_CRASH_LOG``: a file that gets one line per counted hit (``<pid> <point> <hit>``), so the
  harness can tell "died at the point" from "died elsewhere" or "never got there".

The kill is ``SIGKILL`` of the process itself: no ``finally``, no ``atexit``, no flush, no rollback
sent to PostgreSQL; exactly what an OOM kill or a lost machine does.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field

from recon_dagster.config import Settings

POINTS: tuple[str, ...] = (
    "worker.after_create",  # upstream task created, its id not yet persisted
    "worker.after_persist",  # task id persisted, nothing polled yet
    "reconcile.after_poll",  # the reconciler has the poll answer and has not acted on it
    "media.mid_download",  # a media body is being streamed into the store (first chunk written)
    "finalize.after_upload",  # every media object stored, nothing settled
    "finalize.in_settle",  # inside the completion transaction, credits committed, not yet COMMIT
    "finalize.after_commit",  # the completion transaction committed, the caller not yet told
    "refund.in_settle",  # inside the fail transaction, credits refunded, not yet COMMIT
)
"""Every point the package calls. The harness's app worker adds ``worker.mid_poll`` through the
provider's ``on_progress`` hook (the worker-side poll loop lives in the provider layer)."""


@dataclass
class _Armed:
    points: frozenset[str]
    kill_on: int
    hold: bool
    probability: float
    rng: random.Random
    log_path: str | None
    hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


_UNREAD = object()
_armed: _Armed | None | object = _UNREAD
_read_lock = threading.Lock()


def _read_env() -> _Armed | None:
    # Read here, once, by the names declared in recon_dagster.config (a lookup on a hot path).
    env = os.environ
    names = frozenset(p.strip() for p in env.get(Settings.crash_at.name, "").split(",") if p.strip())
    if not names:
        return None
    seed = env.get(Settings.crash_seed.name, "").strip()
    return _Armed(
        points=names,
        kill_on=max(1, int(env.get(Settings.crash_hits.name, "1") or 1)),
        hold=env.get(Settings.crash_hold.name, "").strip() in ("1", "true", "yes"),
        probability=float(env.get(Settings.crash_prob.name, "1") or 1),
        rng=random.Random(int(seed) if seed else None),
        log_path=env.get(Settings.crash_log.name) or None,
    )


def crash_point(name: str) -> None:
    """SIGKILL this process here if ``name`` is armed (see the module docstring); else nothing."""
    global _armed
    armed = _armed
    if armed is None:
        return
    if armed is _UNREAD:
        with _read_lock:  # threads arriving together must share one hit counter
            if _armed is _UNREAD:
                _armed = _read_env()
            armed = _armed
        if armed is None:
            return
    assert isinstance(armed, _Armed)
    if name not in armed.points:
        return
    with armed.lock:
        if armed.probability < 1 and armed.rng.random() >= armed.probability:
            return
        armed.hits += 1
        hit = armed.hits
        if armed.log_path:
            with open(armed.log_path, "a") as log:
                log.write(f"{os.getpid()} {name} {hit}\n")
        if hit >= armed.kill_on:
            os.kill(os.getpid(), signal.SIGKILL)
    if armed.hold:
        while True:  # parked at the point until the kill-th hit takes the whole process down
            time.sleep(3600)


def reset_for_tests() -> None:
    """Forget the environment read (a test that changes ``RECON_CRASH_*`` in-process)."""
    global _armed
    _armed = _UNREAD


__all__ = ["POINTS", "crash_point", "reset_for_tests"]
