"""Issue 34 rule 2 probed with variants: a provider's Retry-After blocks the whole account (every
process, every kind, every request already waiting for its token), and refusals never grow the
wait after it. Two ``AccountLimiter``s on two engines stand for two processes.
"""

from __future__ import annotations

import secrets
import threading
import time

import pytest
import sqlalchemy as sa

from recon_dagster.db.engine import normalize_url
from recon_dagster.providers.limits import AccountLimiter, AccountLimits, Budget
from recon_dagster.providers.status import NotSent

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def two_engines(database_url, db):
    engines = [sa.create_engine(normalize_url(database_url), pool_size=30) for _ in range(2)]
    yield engines
    for e in engines:
        e.dispose()


def _limits(**kw) -> AccountLimits:  # noqa: ANN003
    return AccountLimits(f"ra-{secrets.token_hex(4)}", **kw)


def test_requests_waiting_for_their_token_when_the_block_comes_wait_it_out(two_engines) -> None:
    """Twenty polls queue for the account's tokens (the burst goes at once, the rest sleep for
    theirs); another process hears a 429 with Retry-After 1.5 s. None of the sleepers goes out
    during the block: they reserved before it, but the provider's word comes after."""
    limits = _limits(reads=Budget(100, 10))  # 9.3 per s, burst 5
    a, b = (AccountLimiter(limits, lambda e=e: e) for e in two_engines)
    a.ensure()
    sent: list[float] = []
    refused: list[NotSent] = []
    lock = threading.Lock()

    def poll() -> None:
        try:
            with a.request("kie-standard", create=False, deadline=time.monotonic() + 8), lock:
                sent.append(time.monotonic())
        except NotSent as exc:
            with lock:
                refused.append(exc)

    threads = [threading.Thread(target=poll) for _ in range(20)]
    for t in threads:
        t.start()
    time.sleep(0.4)  # the burst went out; the others sleep until their token's time
    block_start = time.monotonic()
    b.block_for(1.5)
    block_end = block_start + 1.5
    for t in threads:
        t.join(20)
    during = [round(s - block_start, 2) for s in sent if block_start + 0.05 < s < block_end - 0.05]
    assert during == [], f"{len(during)} sent during the Retry-After, at +{during} s"
    # Every one of them still went out (their deadlines allow it), at the account's rate from
    # the end of the block: the block added its own length to the queue, nothing more.
    assert len(sent) == 20 and not refused, refused[:1]
    rate, burst = limits.reads.bucket()  # type: ignore[union-attr]
    assert max(sent) - block_end <= (20 - burst) / rate + 1.0, max(sent) - block_end
    # And a new request after them is served without a wait the refunds would have grown.
    with b.request("kie-veo", create=False, deadline=time.monotonic() + 2):
        pass
