"""Account budgets are configured, validated and never overwritten by one process, against real
PostgreSQL with two engines standing for two processes."""

from __future__ import annotations

import secrets
import time

import pytest
import sqlalchemy as sa

from recon_dagster.db.engine import normalize_url
from recon_dagster.providers.limits import (
    DEFAULT_LIMITS,
    AccountLimiter,
    AccountLimits,
    Budget,
    LimitsConfigError,
    TokenWaitTooLong,
    parse_account_limits,
)

pytestmark = pytest.mark.timeout(60)


def _account() -> str:
    return f"acct-{secrets.token_hex(4)}"


@pytest.fixture
def two_engines(database_url, db):
    engines = [sa.create_engine(normalize_url(database_url)) for _ in range(2)]
    yield engines
    for e in engines:
        e.dispose()


# -- every limit validated at load, with bounds, one line naming the variable -----------

BAD_LIMITS = [
    "concurrency=99999999999999999999",
    "concurrency=2000000",
    "concurrency=0",
    "concurrency=-3",
    "reads=600/nan",
    "reads=600/inf",
    "reads=600/1e-9",
    "reads=600/-60",
    "reads=0",
    "reads=0/60",
    "reads=99999999999/60",
    "creates=1000001/60",
    "creates=20/1e12",
    "reads=600/60s0",
    "kind_share=nan",
    "kind_share=0",
    "reads",
]


@pytest.mark.parametrize("raw", BAD_LIMITS)
def test_every_limit_is_validated_at_load_with_bounds_naming_the_variable(raw: str) -> None:
    with pytest.raises(LimitsConfigError) as caught:
        parse_account_limits("RECON_LIMIT_KIE", raw, DEFAULT_LIMITS["kie"])
    message = str(caught.value)
    assert message.startswith("RECON_LIMIT_KIE") and "\n" not in message


@pytest.mark.parametrize(
    ("raw", "field", "expected"),
    [
        ("reads=none", "reads", None),
        ("concurrency=none", "concurrency", None),
        ("reads=600/60", "reads", Budget(600, 60)),
        ("reads=1/86400", "reads", Budget(1, 86400)),
        ("concurrency=1000", "concurrency", 1000),
    ],
)
def test_none_stays_the_explicit_unlimited_and_sane_values_load(raw, field, expected) -> None:
    limits = parse_account_limits("RECON_LIMIT_KIE", raw, DEFAULT_LIMITS["kie"])
    assert getattr(limits, field) == expected


# -- the shared budget is configured, not overwritten ----------------------------------


def test_a_process_whose_budget_differs_from_the_account_row_refuses_to_start(two_engines, monkeypatch):
    monkeypatch.delenv("RECON_LIMITS_MIGRATE", raising=False)
    account = _account()
    good = AccountLimiter(AccountLimits(account, reads=Budget(600, 60)), lambda: two_engines[0])
    good.ensure()
    rogue = AccountLimiter(
        parse_account_limits("RECON_LIMIT_KIE", f"reads=1/86400,account={account}", DEFAULT_LIMITS["kie"]),
        lambda: two_engines[1],
    )
    with pytest.raises(LimitsConfigError) as caught:
        rogue.ensure()
    message = str(caught.value)
    assert "\n" not in message and "RECON_LIMIT_KIE" in message
    assert "1/86400" in message and "600/60" in message and "RECON_LIMITS_MIGRATE" in message
    # The well-configured process's next token is still free: the row was not rewritten.
    assert good.take_token(create=False) == 0.0
    with two_engines[0].connect() as conn:
        rate = conn.execute(
            sa.text("SELECT rate_per_s FROM provider_limit_buckets WHERE account = :a AND bucket = 'read'"),
            {"a": account},
        ).scalar_one()
    assert rate == pytest.approx(Budget(600, 60).bucket()[0])


def test_an_explicit_budget_migration_changes_the_account_row(two_engines, monkeypatch):
    account = _account()
    AccountLimiter(AccountLimits(account, reads=Budget(600, 60)), lambda: two_engines[0]).ensure()
    monkeypatch.setenv("RECON_LIMITS_MIGRATE", "1")
    AccountLimiter(AccountLimits(account, reads=Budget(120, 60)), lambda: two_engines[1]).ensure()
    monkeypatch.delenv("RECON_LIMITS_MIGRATE")
    # Now the old configuration is the one that differs.
    with pytest.raises(LimitsConfigError, match="120/60"):
        AccountLimiter(AccountLimits(account, reads=Budget(600, 60)), lambda: two_engines[0]).ensure()


def test_a_token_wait_never_outlives_the_requests_deadline(two_engines):
    account = _account()
    limits = AccountLimits(account, reads=Budget(2, 3600))
    a = AccountLimiter(limits, lambda: two_engines[0])
    b = AccountLimiter(limits, lambda: two_engines[1])
    with a.request("kie-standard", create=False, deadline=time.monotonic() + 2):
        pass  # the burst token
    started = time.monotonic()
    soon = time.monotonic() + 2
    with pytest.raises(TokenWaitTooLong) as caught, b.request("kie-standard", create=False, deadline=soon):
        pass
    assert time.monotonic() - started < 2
    assert "\n" not in str(caught.value) and "deadline" in str(caught.value)


def test_a_token_wait_never_outlives_the_lease_without_a_deadline(two_engines, monkeypatch):
    monkeypatch.setenv("RECON_LEASE_S", "60")
    account = _account()
    limits = AccountLimits(account, creates=Budget(2, 3600))
    lim = AccountLimiter(limits, lambda: two_engines[0])
    with lim.request("kie-standard", create=True):
        pass
    started = time.monotonic()
    with pytest.raises(TokenWaitTooLong, match="lease"), lim.request("kie-standard", create=True):
        pass
    assert time.monotonic() - started < 2


def test_the_cli_refuses_to_start_with_a_budget_that_differs_from_the_account_row(db, monkeypatch, capsys):
    from recon_dagster.cli import commands as cli
    from recon_dagster.providers.limits import verify_account_budgets

    account = _account()
    monkeypatch.delenv("RECON_LIMITS_MIGRATE", raising=False)
    verify_account_budgets({"RECON_LIMIT_KIE": f"account={account}"})  # a well-configured process
    monkeypatch.setenv("RECON_LIMIT_KIE", f"reads=1/86400,account={account}")

    assert cli.main(["reconcile", "--once"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "RECON_LIMIT_KIE" in err and "1/86400" in err and "600/60" in err


def test_setup_statements_run_under_a_statement_timeout_instead_of_waiting_on_a_lock(
    two_engines, monkeypatch
):
    from recon_dagster.providers import limits as limits_module

    monkeypatch.setattr(limits_module, "SETUP_TIMEOUT_MS", 500)
    account = _account()
    AccountLimiter(AccountLimits(account, reads=Budget(600, 60)), lambda: two_engines[0]).ensure()
    with two_engines[0].begin() as holder:  # another process mid-setup holds the account's rows
        holder.execute(sa.text("LOCK TABLE provider_limit_buckets IN ACCESS EXCLUSIVE MODE"))
        started = time.monotonic()
        with pytest.raises(sa.exc.OperationalError, match="lock timeout|statement timeout"):
            AccountLimiter(AccountLimits(account, reads=Budget(600, 60)), lambda: two_engines[1]).ensure()
        assert time.monotonic() - started < 5
