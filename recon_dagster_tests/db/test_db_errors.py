"""Database errors are named for what they are: too many connections,
authentication, a missing database, unreachable, a statement timeout -- each with its own fix,
not "database unavailable ... start PostgreSQL there". Every error comes from the real server."""

from __future__ import annotations

import secrets

import pytest
import sqlalchemy as sa

from recon_dagster.cli.commands import FIX_UNAVAILABLE, as_cli_error
from recon_dagster.db.engine import get_engine, with_database

pytestmark = pytest.mark.timeout(60)


def _connect_error(url: str) -> BaseException:
    with pytest.raises(Exception) as caught, get_engine(url).connect():
        pass
    return caught.value


@pytest.fixture
def capped_role(engine):
    role = f"recon_capped_{secrets.token_hex(3)}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0"))
    yield role
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP ROLE {role}"))


def _url_as(database_url: str, user: str) -> str:
    return sa.make_url(database_url).set(username=user).render_as_string(hide_password=False)


def test_database_errors_are_named_too_many_connections(database_url, capped_role):
    err = as_cli_error(_connect_error(_url_as(database_url, capped_role)))
    assert "too many connections" in err.what and err.fix != FIX_UNAVAILABLE
    assert "max_connections" in err.fix and "RECON_DB_MAX_CONNECTIONS" in err.fix


def test_database_errors_are_named_authentication_failed(database_url):
    err = as_cli_error(_connect_error(_url_as(database_url, f"nobody_{secrets.token_hex(3)}")))
    assert "authentication failed" in err.what and err.fix != FIX_UNAVAILABLE


def test_database_errors_are_named_database_does_not_exist(database_url):
    err = as_cli_error(_connect_error(with_database(database_url, "recon_no_such_db")))
    assert "does not exist" in err.what and err.fix != FIX_UNAVAILABLE


def test_database_errors_are_named_unreachable():
    err = as_cli_error(_connect_error("postgresql://root@127.0.0.1:1/nope"))
    assert err.what.startswith("database unavailable at host=127.0.0.1 port=1 db=nope: ")
    assert "unreachable" in err.what and err.fix == FIX_UNAVAILABLE


def test_database_errors_are_named_statement_timeout(engine):
    with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL statement_timeout = 50"))
        conn.execute(sa.text("SELECT pg_sleep(2)"))
    err = as_cli_error(caught.value)
    assert "statement timeout" in err.what and "unexpected" not in err.what
    assert "\n" not in err.what
