"""Through the provider client itself: the account's concurrency slot and
the process's own request slot live exactly as long as the exchange, whatever ends it (an answer
error, a timeout, an interrupt, a database error in the limiter after the slot was taken).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from recon_dagster.providers.http import HttpSettings, Limits, ProviderHttp
from recon_dagster.providers.limits import AccountLimits, Budget
from recon_dagster.providers.status import NotSent, NotSentReason
from recon_dagster_tests.support.ledger import held_slots

pytestmark = pytest.mark.timeout(60)


def _client(sandbox, **limits) -> ProviderHttp:
    account = AccountLimits(f"slot-{secrets.token_hex(4)}", concurrency=2, slot_ttl_s=60, **limits)
    return ProviderHttp(
        "kie", sandbox.api_base_url("kie"), {}, "probe-secret",
        HttpSettings(max_attempts=1, read_deadline_s=5, limits=Limits(max_concurrency=2), account=account),
        lambda response: None,
    )  # fmt: skip


class _Boom(Exception):
    pass


@pytest.mark.parametrize("ending", ["error", "keyboard_interrupt", "system_exit"])
def test_whatever_ends_the_exchange_both_slots_are_given_back(db, sandbox, monkeypatch, ending: str) -> None:
    http = _client(sandbox, reads=Budget(600, 60))
    raised: type[BaseException] = {
        "error": _Boom,
        "keyboard_interrupt": KeyboardInterrupt,
        "system_exit": SystemExit,
    }[ending]
    inside: list[int] = []

    def exchange(*args, **kwargs):
        inside.append(held_slots(db, http.settings.account.account))  # type: ignore[union-attr]
        raise raised("the exchange ended")

    monkeypatch.setattr(http, "_send_capped", exchange)
    try:
        with pytest.raises(raised):
            http.request("GET", "/api/v1/jobs/recordInfo", label="kie-standard", idempotent=True)
    finally:
        http.close()
    assert inside == [1]  # it did hold the account's slot during the exchange
    assert held_slots(db, http.settings.account.account) == 0  # type: ignore[union-attr]
    assert http._limiter.semaphore._value == 2  # type: ignore[attr-defined]  # the process's slot too


def test_a_database_error_on_the_block_check_after_a_token_wait_releases_the_slot(
    db, sandbox, monkeypatch
) -> None:
    """The request slept for its token; the limiter's read of the account's block then fails: the
    request is not sent (``limiter_database_unreachable``) and both slots are given back."""
    http = _client(sandbox, reads=Budget(600, 60))
    limiter = http._account
    assert limiter is not None
    monkeypatch.setattr(limiter, "take_token", lambda create, max_wait=None, refund=0: 0.05)

    def unreachable(create: bool) -> float:
        raise sa.exc.OperationalError("SELECT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(limiter, "_blocked_s", unreachable)
    try:
        with pytest.raises(NotSent) as caught:
            http.request("GET", "/api/v1/jobs/recordInfo", label="kie-standard", idempotent=True)
    finally:
        http.close()
    assert caught.value.reason is NotSentReason.LIMITER_DB
    assert held_slots(db, limiter.limits.account) == 0
    assert http._limiter.semaphore._value == 2  # type: ignore[attr-defined]
    assert sandbox.requests_total() == 0


@pytest.mark.slow
def test_a_slot_held_while_its_request_waits_for_a_token_outlives_its_ttl(db) -> None:
    """The request holds the account's only slot while it waits about 4 s for its token, four
    times the slot TTL: the slot is renewed all along (no other process gets it), then freed."""
    from recon_dagster.providers.limits import AccountLimiter

    limits = AccountLimits(f"slot-{secrets.token_hex(4)}", reads=Budget(3, 4), concurrency=1, slot_ttl_s=1.0)
    waiter, other = AccountLimiter(limits, lambda: db), AccountLimiter(limits, lambda: db)
    waiter.take_token(create=False)  # the burst: the next token comes in about 4 s
    done = threading.Event()

    def request() -> None:
        with waiter.request("kie-standard", create=False, deadline=time.monotonic() + 8):
            done.set()

    t = threading.Thread(target=request)
    t.start()
    try:
        time.sleep(0.3)
        while not done.is_set():
            held = other.take_slot("kie-veo")
            assert held is None or done.is_set(), "the slot expired under a request waiting for its token"
            time.sleep(0.2)
    finally:
        t.join(10)
    assert done.is_set() and held_slots(db, limits.account) == 0


def test_a_request_interrupted_while_it_sleeps_for_its_token_gives_its_slot_back(db) -> None:
    from recon_dagster.providers.limits import AccountLimiter

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    limits = AccountLimits(f"slot-{secrets.token_hex(4)}", reads=Budget(3, 4), concurrency=1, slot_ttl_s=60)
    lim = AccountLimiter(limits, lambda: db, sleep=interrupted)
    lim.take_token(create=False)
    with pytest.raises(KeyboardInterrupt), lim.request("kie-standard", create=False):
        pytest.fail("sent before its token")
    assert held_slots(db, limits.account) == 0


@contextmanager
def _bucket_row_held(db: sa.Engine, account: str) -> Iterator[None]:
    """Another session holds the account's bucket rows until the block ends."""
    locked, release = threading.Event(), threading.Event()

    def locker() -> None:
        with db.begin() as conn:
            conn.execute(
                sa.text("SELECT 1 FROM provider_limit_buckets WHERE account = :a FOR UPDATE"), {"a": account}
            )
            locked.set()
            release.wait(15)

    t = threading.Thread(target=locker)
    t.start()
    assert locked.wait(10)
    try:
        yield
    finally:
        release.set()
        t.join(20)


def test_a_retry_after_stuck_behind_a_held_bucket_row_is_given_up_at_the_setup_timeout(
    db, monkeypatch
) -> None:
    """Sharing a Retry-After (after the exchange that heard it) waits for a held bucket row at
    most the setup timeout, then is logged and given up; it never holds the request's thread."""
    from recon_dagster.providers import limits as limits_module
    from recon_dagster.providers.limits import AccountLimiter

    monkeypatch.setattr(limits_module, "SETUP_TIMEOUT_MS", 700)
    limits = AccountLimits(f"slot-{secrets.token_hex(4)}", reads=Budget(600, 60))
    lim = AccountLimiter(limits, lambda: db)
    lim.ensure()
    with _bucket_row_held(db, limits.account):
        started = time.monotonic()
        lim.block_for(30)
        assert time.monotonic() - started < 3.0  # before: as long as the row was held (15 s)


@pytest.mark.slow
def test_a_token_statement_stuck_behind_a_lock_ends_at_the_request_bound_not_sent(db, caplog) -> None:
    """Another session holds the account's bucket row (a process whose connection died inside its
    token statement holds it until the server notices, which takes as long as TCP keepalive): the
    request is not sent once its bound has passed, its slot given back, instead of waiting for
    the lock however long it is held (on the app's own engine, which has no statement timeout)."""
    from recon_dagster.providers.limits import AccountLimiter

    limits = AccountLimits(
        f"slot-{secrets.token_hex(4)}", reads=Budget(600, 60), concurrency=2, slot_ttl_s=60
    )
    lim = AccountLimiter(limits, lambda: db)
    lim.ensure()
    with _bucket_row_held(db, limits.account):
        started = time.monotonic()
        with (
            pytest.raises(NotSent) as caught,
            lim.request("kie-standard", create=False, deadline=started + 1.0),
        ):
            pytest.fail("sent while its token statement could not run")
        elapsed = time.monotonic() - started
    assert elapsed < 3.0, elapsed  # before: as long as the lock was held (15 s here), then sent
    assert caught.value.reason is NotSentReason.LIMITER_DB
    assert held_slots(db, limits.account) == 0
