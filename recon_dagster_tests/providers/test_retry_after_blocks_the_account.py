"""A provider's Retry-After blocks the whole account (every
process, every kind, every request already waiting for its token), and refusals never grow the
wait after it. Two ``AccountLimiter``s on two engines stand for two processes.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest
import sqlalchemy as sa

from recon_dagster.db.engine import normalize_url
from recon_dagster.providers.limits import AccountLimiter, AccountLimits, Budget
from recon_dagster.providers.status import NotSent, ProviderHTTPError

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def two_engines(database_url, db):
    engines = [sa.create_engine(normalize_url(database_url), pool_size=30) for _ in range(2)]
    yield engines
    for e in engines:
        e.dispose()


def _limits(**kw) -> AccountLimits:
    return AccountLimits(f"ra-{secrets.token_hex(4)}", **kw)


@pytest.mark.slow
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


def _served(limiters: list[AccountLimiter], kinds: list[str], seconds: float) -> int:
    """Requests let out within ``seconds``, asked in turn by every limiter for every kind."""
    served = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for lim in limiters:
            for kind in kinds:
                try:
                    with lim.request(kind, create=False, deadline=time.monotonic() + 0.3):
                        served += 1
                except NotSent:
                    pass
    return served


@pytest.mark.slow
def test_repeated_retry_afters_from_two_processes_and_kinds_end_with_the_last_one(two_engines) -> None:
    """Three 429s in a row (two processes, Retry-After 1 s each, half a second apart) while both
    processes keep asking for two kinds: everything is refused until the last block ends, and
    within Retry-After + 5 s of it the account serves its rate again (the refusals took nothing)."""
    limits = _limits(reads=Budget(100, 10))
    a, b = (AccountLimiter(limits, lambda e=e: e) for e in two_engines)
    a.ensure()
    kinds = ["kie-standard", "kie-veo"]
    started = time.monotonic()
    for i, lim in enumerate((a, b, a)):
        lim.block_for(1.0)
        if i < 2:
            assert _served([a, b], kinds, 0.5) == 0
    last_end = time.monotonic() + 1.0
    while time.monotonic() < last_end - 0.35:
        assert _served([a, b], kinds, 0.1) == 0
    time.sleep(max(0.0, last_end - time.monotonic()))
    rate, _ = limits.reads.bucket()  # type: ignore[union-attr]
    served = _served([a, b], kinds, 2.0)
    assert served >= 0.7 * rate * 2.0, served
    with two_engines[0].connect() as conn:
        count = conn.execute(
            sa.text("SELECT retry_afters FROM provider_limit_accounts WHERE account = :a"),
            {"a": limits.account},
        ).scalar_one()
    assert count == 3 and time.monotonic() - started < 10


class _Throttler(BaseHTTPRequestHandler):
    """Answers every request 429 with the server's ``retry_after`` header value."""

    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        body = b'{"error": "rate limited"}'
        self.send_response(429)
        self.send_header("Retry-After", self.server.retry_after())  # type: ignore[attr-defined]
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def throttler():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Throttler)
    Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _blocked_for_s(engine: sa.Engine, account: str) -> float:
    with engine.connect() as conn:
        return float(
            conn.execute(
                sa.text(
                    "SELECT EXTRACT(EPOCH FROM blocked_until - clock_timestamp()) FROM provider_limit_accounts "
                    "WHERE account = :a"
                ),
                {"a": account},
            ).scalar_one()
        )


@pytest.mark.parametrize(
    ("header", "low", "high"),
    [
        (lambda: format_datetime(datetime.now(UTC) + timedelta(seconds=3), usegmt=True), 1.0, 3.5),
        (lambda: "86400", 110.0, 120.5),  # a day: capped at retry_after_max_s (120)
        (lambda: format_datetime(datetime.now(UTC) + timedelta(days=400), usegmt=True), 110.0, 120.5),
        (lambda: "1e400", 110.0, 120.5),  # infinite: capped too, never a database error
    ],
    ids=["http_date", "a_day", "http_date_next_year", "infinite"],
)
def test_a_retry_after_in_any_form_blocks_the_account_for_what_it_says_capped(
    db, throttler, header, low: float, high: float
) -> None:
    from recon_dagster.providers.http import HttpSettings, ProviderHttp

    throttler.retry_after = header
    limits = _limits(reads=Budget(600, 60))
    http = ProviderHttp(
        "kie", f"http://127.0.0.1:{throttler.server_address[1]}", {}, "secret",
        HttpSettings(max_attempts=1, account=limits), lambda response: None,
    )  # fmt: skip
    try:
        with pytest.raises(ProviderHTTPError, match="429"):
            http.request("GET", "/poll", label="kie-standard", idempotent=True)
    finally:
        http.close()
    assert low <= _blocked_for_s(db, limits.account) <= high
