"""A request the shared limiter does not let out costs nothing.

- a refused reservation takes no token, so no sequence of refusals grows the wait: after a
  Retry-After the account serves its budget again at once;
- a concurrency slot lives exactly as long as its request, however long the request takes and
  however it ends;
- a limiter that cannot reach its database fails closed: nothing is sent, the slot is released,
  one log line says so.

Two ``AccountLimiter``s on two engines stand for two processes sharing one account.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import pytest
import sqlalchemy as sa

from recon_dagster.db.engine import normalize_url
from recon_dagster.providers.limits import AccountLimiter, AccountLimits, Budget
from recon_dagster.providers.status import NotSent, NotSentReason
from recon_dagster_tests.support.ledger import held_slots

pytestmark = pytest.mark.timeout(90)


def _account() -> str:
    return f"ns-{secrets.token_hex(4)}"


@pytest.fixture
def two_engines(database_url, db):
    engines = [sa.create_engine(normalize_url(database_url)) for _ in range(2)]
    yield engines
    for e in engines:
        e.dispose()


def _serve(limiter: AccountLimiter, deadline_s: float, kind: str = "kie-standard") -> bool:
    """One request with ``deadline_s`` to get out: True when it was let out, False when refused."""
    try:
        with limiter.request(kind, create=False, deadline=time.monotonic() + deadline_s):
            return True
    except NotSent:
        return False


# -- a refusal takes no token -------------------------------------------------------------


@pytest.mark.parametrize("create", [False, True], ids=["reads", "creates"])
@pytest.mark.slow
def test_refusals_during_a_retry_after_never_grow_the_wait_after_it(two_engines, create: bool) -> None:
    """Two processes keep asking while the account is blocked; every ask is refused (its token
    would come after its deadline). Once the block ends the account serves its rate at once:
    today each refusal kept its token and the wait after the block grew by one token per refusal."""
    account = _account()
    budget = Budget(100, 10)  # 9.3 per s, burst 5
    limits = AccountLimits(account, creates=budget) if create else AccountLimits(account, reads=budget)
    a, b = (AccountLimiter(limits, lambda e=e: e) for e in two_engines)
    block_s = 2.0
    a.block_for(block_s)
    blocked_until = time.monotonic() + block_s
    refused = 0
    hints = []
    while time.monotonic() < blocked_until - 0.4:
        for lim in (a, b):
            try:
                with lim.request("kie-standard", create=create, deadline=time.monotonic() + 0.3):
                    pytest.fail("a request got out during the Retry-After")
            except NotSent as exc:
                assert exc.reason in (NotSentReason.LIMITER_REFUSED, NotSentReason.TOKEN_WAIT)
                hints.append(exc.retry_in_s)
                refused += 1
    assert refused > 40  # enough refusals that kept tokens would have pushed the wait out by seconds
    time.sleep(max(0.0, blocked_until - time.monotonic()))
    served = 0
    window_end = time.monotonic() + 2.0
    while time.monotonic() < window_end:
        for lim in (a, b):
            served += _serve(lim, deadline_s=0.5)
    rate, burst = budget.bucket()
    # The bucket refills from the end of the block: its rate over the window (plus what the burst
    # holds by then). With the tokens refusals kept, this was 0.
    assert served >= 0.7 * rate * 2.0, (served, refused)
    # Each refusal said when the account lets a request out again: at the end of the block.
    assert all(h is not None and 0 < h <= block_s + 0.5 for h in hints), hints[:5]


def test_a_refused_token_is_not_taken_from_the_bucket(db) -> None:
    lim = AccountLimiter(AccountLimits(_account(), reads=Budget(2, 3600)), lambda: db)
    lim.take_token(create=False)  # the only token of the hour
    before = _tokens(db, lim.limits.account)
    for _ in range(20):
        with (
            pytest.raises(NotSent) as caught,
            lim.request("kie-standard", create=False, deadline=time.monotonic() + 1),
        ):
            pass
        assert caught.value.reason is NotSentReason.TOKEN_WAIT
    assert _tokens(db, lim.limits.account) == pytest.approx(before, abs=0.01)


def _tokens(engine: sa.Engine, account: str) -> float:
    with engine.connect() as conn:
        return float(
            conn.execute(
                sa.text("SELECT tokens FROM provider_limit_buckets WHERE account = :a AND bucket = 'read'"),
                {"a": account},
            ).scalar_one()
        )


# -- a slot lives as long as its request ----------------------------------------------------


@pytest.mark.slow
def test_a_slot_outlives_its_ttl_while_its_request_is_in_flight(two_engines) -> None:
    """A request that takes three times the slot TTL keeps its slot all along (renewed while in
    flight): another process never gets the account's only slot meanwhile, and gets it right after."""
    account = _account()
    limits = AccountLimits(account, concurrency=1, slot_ttl_s=1.0)
    holder = AccountLimiter(limits, lambda: two_engines[0])
    other = AccountLimiter(limits, lambda: two_engines[1])
    inside = threading.Event()
    leave = threading.Event()

    def long_request() -> None:
        with holder.request("anthropic-sync", create=True):
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=long_request)
    t.start()
    assert inside.wait(10)
    try:
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            assert other.take_slot("anthropic-sync") is None, "the slot expired under a live request"
            time.sleep(0.1)
    finally:
        leave.set()
        t.join(10)
    assert held_slots(two_engines[1], account) == 0  # released on exit, not left to its TTL
    assert other.take_slot("anthropic-sync") is not None


@pytest.mark.parametrize("exit_path", ["raises", "base_exception", "generator_closed"])
def test_a_slot_is_released_on_every_exit_path(db, exit_path: str) -> None:
    lim = AccountLimiter(AccountLimits(_account(), concurrency=2, slot_ttl_s=60), lambda: db)
    if exit_path == "raises":
        with pytest.raises(ValueError), lim.request("kie-standard", create=False):
            raise ValueError("the request failed")
    elif exit_path == "base_exception":
        with pytest.raises(KeyboardInterrupt), lim.request("kie-standard", create=False):
            raise KeyboardInterrupt
    else:
        cm = lim.request("kie-standard", create=False)
        cm.__enter__()
        assert held_slots(db, lim.limits.account) == 1
        cm.gen.close()  # abandoned mid-request (the thread was torn down)
    assert held_slots(db, lim.limits.account) == 0
    time.sleep(0.2)
    assert held_slots(db, lim.limits.account) == 0  # and the renewal did not bring it back


def test_a_slot_wait_past_the_deadline_is_not_sent_in_time(two_engines) -> None:
    account = _account()
    limits = AccountLimits(account, concurrency=1, slot_ttl_s=60)
    a = AccountLimiter(limits, lambda: two_engines[0])
    b = AccountLimiter(limits, lambda: two_engines[1])
    assert a.take_slot("kie-standard") is not None
    started = time.monotonic()
    with (
        pytest.raises(NotSent) as caught,
        b.request("kie-standard", create=False, deadline=time.monotonic() + 0.5),
    ):
        pytest.fail("sent without a slot")
    assert caught.value.reason is NotSentReason.SLOT_WAIT
    assert time.monotonic() - started < 3  # today it waited up to SLOT_WAIT_MAX_S (600 s)


# -- fail closed ------------------------------------------------------------------------------


def test_a_limiter_without_its_database_sends_nothing_and_says_so_once(caplog) -> None:
    from recon_dagster.db.engine import get_engine

    engine = get_engine("postgresql://nobody@127.0.0.1:1/none")  # nothing listens on port 1
    lim = AccountLimiter(AccountLimits(_account(), reads=Budget(10, 1), concurrency=2), lambda: engine)
    caplog.set_level(logging.ERROR, logger="recon_dagster.providers.limits")
    sent = []
    for _ in range(3):
        with pytest.raises(NotSent) as caught, lim.request("kie-standard", create=False):
            sent.append(1)
        assert caught.value.reason is NotSentReason.LIMITER_DB
    assert sent == []
    lines = [r for r in caplog.records if r.name == "recon_dagster.providers.limits"]
    assert len(lines) == 1 and lim.limits.account in lines[0].getMessage()
    assert "\n" not in lines[0].getMessage() and "not sent" in lines[0].getMessage()


def test_a_database_error_after_the_slot_was_taken_releases_the_slot_and_sends_nothing(
    database_url, db, caplog
) -> None:
    """The token statement fails (here: it times out behind another transaction's row lock) after
    the slot was taken: today the request went ahead unlimited and the slot stayed held."""
    account = _account()
    impatient = sa.create_engine(
        normalize_url(database_url), connect_args={"options": "-c statement_timeout=300"}
    )
    try:
        lim = AccountLimiter(
            AccountLimits(account, reads=Budget(600, 60), concurrency=4, slot_ttl_s=120), lambda: impatient
        )
        lim.ensure()
        caplog.set_level(logging.ERROR, logger="recon_dagster.providers.limits")
        with db.begin() as locker:
            locker.execute(
                sa.text("SELECT 1 FROM provider_limit_buckets WHERE account = :a FOR UPDATE"), {"a": account}
            )
            with pytest.raises(NotSent) as caught, lim.request("kie-standard", create=False):
                pytest.fail("sent while the limiter could not reserve a token")
        assert caught.value.reason is NotSentReason.LIMITER_DB
        assert held_slots(db, account) == 0
        assert sum(r.name == "recon_dagster.providers.limits" for r in caplog.records) == 1
        # The database answers again: the next request goes out.
        with lim.request("kie-standard", create=False):
            pass
    finally:
        impatient.dispose()
