"""The CLI's one error shape: ``recon-dagster <command>: <what went wrong>; <how to fix it>``.

``CliError`` carries the pair; ``as_cli_error`` turns any known exception into one, so every
command fails with one line and the traceback only with ``--debug`` or ``RECON_DEBUG=1``.
"""

import importlib
import os
import re
import warnings

from recon_dagster.config import PREFIX, Settings

DEBUG_ENV = Settings.debug.name
_URL = Settings.database_url.name

# Dagster's own warnings that mean nothing to a user of this CLI (its pydantic v1-style calls,
# beta flags on its own defaults). The same list as pytest's filterwarnings in pyproject.toml,
# in the same syntax (a test keeps the two equal).
DAGSTER_NOISE = (
    "ignore::pydantic.warnings.PydanticDeprecatedSince20:dagster_shared",
    "ignore:Parameter `owners`:dagster.BetaWarning",
    "ignore:InitResourceContext.dagster_run is deprecated:DeprecationWarning",
)

FIX_URL = f"set {_URL} or --database-url to postgresql://user:password@host:port/dbname"
FIX_NO_URL = (
    f"{FIX_URL} (the app's PostgreSQL); only `recon-dagster demo` / `dev` start the embedded "
    f"development server by themselves (elsewhere: {Settings.embedded_postgres.name}=1)"
)
FIX_UNAVAILABLE = f"start PostgreSQL there, or point {_URL} / --database-url at a running one"
FIX_MIGRATE = "run `recon-dagster migrate`"
FIX_DATABASE = {
    "too many connections": f"keep {Settings.db_max_connections.name} (and the app's own connections) within "
    "the server's max_connections or the role's connection limit, or raise those",
    "authentication failed": f"check the user and password in {_URL} / --database-url",
    "database does not exist": f"create that database, or point {_URL} / --database-url at one",
}
FIX_TIMEOUT = "another session may hold a lock it needs (see pg_stat_activity); retry once it is gone"
FIX_DEBUG = "re-run with --debug for the traceback"


class CliError(Exception):
    """A failure the user can act on: what went wrong, and how to fix it (``code`` 2: usage)."""

    def __init__(self, what: str, fix: str, code: int = 1) -> None:
        super().__init__(f"{what}; {fix}")
        # "; " separates what from the fix in the one line; keep it out of the "what".
        self.what = _one_line(what).replace("; ", ", ")
        self.fix = _one_line(fix)
        self.code = code


def require_installed(module: str, extra: str, needed_for: str) -> None:
    """A ``CliError`` naming the extra to install when ``module`` (an optional extra's) is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise CliError(
            f"{needed_for} needs {module.replace('_', '-')}, which is not installed",
            f"pip install 'recon_dagster[{extra}]' (the dev extra includes it)",
        )


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def quiet_dagster_warnings() -> None:
    """Apply ``DAGSTER_NOISE`` (pytest's ``action:message:category:module`` filters)."""
    for spec in DAGSTER_NOISE:
        action, message, category, module = (spec.split(":") + ["", "", ""])[:4]
        cls: type[Warning] = Warning
        if category:
            mod, _, name = category.rpartition(".")
            cls = getattr(importlib.import_module(mod or "builtins"), name)
        warnings.filterwarnings(action, message=message, category=cls, module=module)  # type: ignore[arg-type]  # DAGSTER_NOISE names valid actions


def as_cli_error(exc: BaseException) -> CliError:
    """Any exception as one ``what; how to fix`` pair; unknown ones say how to see more."""
    import sqlalchemy as sa

    from recon_dagster.db.embedded import EmbeddedPostgresError, embedded_pgdata
    from recon_dagster.db.engine import (
        STATEMENT_TIMEOUTS,
        DatabaseNotConfigured,
        DatabaseUnavailable,
        InvalidDatabaseUrl,
    )
    from recon_dagster.db.migrate import MigrationError
    from recon_dagster.db.schema_contract import SchemaContractError

    if isinstance(exc, CliError):
        return exc
    from recon_dagster.db.grants import DOC as GRANTS_DOC
    from recon_dagster.db.grants import MissingGrant

    if isinstance(exc, MissingGrant):
        return CliError(exc.what, exc.fix)
    if isinstance(exc, sa.exc.ProgrammingError) and type(exc.orig).__name__ == "InsufficientPrivilege":
        return CliError(
            _one_line(str(exc.orig)), f"grant it to the runtime role, as deploy/roles.sql does ({GRANTS_DOC})"
        )
    if isinstance(exc, InvalidDatabaseUrl):
        return CliError(str(exc), FIX_URL)
    if isinstance(exc, DatabaseNotConfigured):
        return CliError(f"{_URL} is not set", FIX_NO_URL)
    if isinstance(exc, DatabaseUnavailable):
        if exc.kind == "unreachable":
            return CliError(f"database unavailable at {exc.reason} (unreachable)", FIX_UNAVAILABLE)
        return CliError(f"database {exc.kind} at {exc.reason}", FIX_DATABASE[exc.kind])
    timeout = STATEMENT_TIMEOUTS.get(getattr(getattr(exc, "orig", None), "sqlstate", None) or "")
    if isinstance(exc, sa.exc.OperationalError) and timeout:
        return CliError(f"database {timeout}: {_one_line(str(exc.orig))}", FIX_TIMEOUT)
    if isinstance(exc, EmbeddedPostgresError):
        return CliError(
            _one_line(str(exc)),
            f"see {embedded_pgdata() / 'log'}, or set {_URL} to a running PostgreSQL",
        )
    if isinstance(exc, SchemaContractError):
        return CliError(exc.what, exc.fix)
    if isinstance(exc, MigrationError):
        return CliError(
            str(exc), exc.fix or "fix the migration named here, then run `recon-dagster migrate` again"
        )
    if isinstance(exc, sa.exc.ProgrammingError) and type(exc.orig).__name__ in (
        "UndefinedTable",
        "UndefinedColumn",
    ):
        return CliError(f"the database schema is behind this code ({_one_line(str(exc.orig))})", FIX_MIGRATE)
    missing = _unset_instance_variable(exc)
    if missing is not None:
        return CliError(
            f"{missing} is not set, and $DAGSTER_HOME/dagster.yaml reads it ({os.environ.get('DAGSTER_HOME', '?')})",
            f"set {missing} (docs/deploying.md#2-secrets-and-settings), or unset DAGSTER_HOME for a "
            "throwaway instance",
        )
    if isinstance(exc, ValueError) and str(exc).startswith((PREFIX, "DAGSTER_")):
        return CliError(str(exc), "fix that environment variable (docs/configuration.md)")
    return CliError(f"unexpected {type(exc).__name__}: {_one_line(str(exc))}", FIX_DEBUG)


# --- the database: URL, reachable, migrated ----------------------------------------------------------


_ENV_VAR_RE = re.compile(r'environment variable "([A-Za-z_][A-Za-z0-9_]*)" which is not set')


def _unset_instance_variable(exc: BaseException) -> str | None:
    """The variable a Dagster instance's configuration reads and the environment lacks (Dagster
    says so deep inside a DagsterInvalidConfigError's errors, after a repr of the config schema)."""
    if type(exc).__name__ != "DagsterInvalidConfigError":
        return None
    texts = [str(getattr(e, "message", e)) for e in getattr(exc, "errors", None) or []] + [str(exc)]
    for text in texts:
        found = _ENV_VAR_RE.search(text)
        if found:
            return found.group(1)
    return None
