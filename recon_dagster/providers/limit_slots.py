"""The renewal of the concurrency slots a process holds (``providers/limits.py``): a slot lives
exactly as long as its request, however long that takes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("recon_dagster.providers.limits")


class SlotRenewer:
    """Keeps the slots of this process's requests in flight alive: every third of the slot TTL,
    ``renew`` pushes each held slot's expiry a TTL out in one statement, so a slot never expires
    under a live request (an Anthropic answer may take minutes; a create has no overall deadline),
    while a killed process's slots still free themselves one TTL after it died. One daemon thread
    per account limiter and process, started with the first slot, idle when none is held.
    ``on_error`` hears a renewal the database refused (the slot then expires at its TTL)."""

    def __init__(
        self,
        name: str,
        ttl_s: float,
        renew: Callable[[list[str]], None],
        on_error: Callable[[BaseException], None],
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self._name, self._period = name, max(0.05, ttl_s / 3)
        self._renew, self._on_error, self._errors = renew, on_error, errors
        self._holders: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def keep(self, holder: str) -> None:
        with self._lock:
            self._holders.add(holder)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"slot-renewer-{self._name}", daemon=True
                )
                self._thread.start()

    def forget(self, holder: str) -> None:
        with self._lock:
            self._holders.discard(holder)

    def _run(self) -> None:
        while True:
            time.sleep(self._period)
            with self._lock:
                holders = list(self._holders)
            if not holders:
                continue
            try:
                self._renew(holders)
            except self._errors as exc:
                self._on_error(exc)
            except Exception:  # the renewer must outlive any surprise
                log.exception("renewing the slots of account %r failed", self._name)
