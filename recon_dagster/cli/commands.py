"""``recon-dagster``: migrate, demo, dev, sandbox, reconcile --once, status, explain, plan, orphans, retry, fail.

Every command goes through ``main``'s one error wrapper: a failure is one line on stderr,
``recon-dagster <command>: <what went wrong>; <how to fix it>``, exit 1 (2 for usage), and the
traceback only with ``--debug`` or ``RECON_DEBUG=1``. A new command raises ``CliError`` (or lets a
known exception through, see ``as_cli_error``) and is registered in ``build_parser``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from recon_dagster.cli.errors import (  # noqa: F401  (re-exported: the commands' error shape)
    DAGSTER_NOISE,
    DEBUG_ENV,
    FIX_DATABASE,
    FIX_DEBUG,
    FIX_MIGRATE,
    FIX_TIMEOUT,
    FIX_UNAVAILABLE,
    FIX_URL,
    CliError,
    _one_line,
    as_cli_error,
    quiet_dagster_warnings,
    require_installed,
)
from recon_dagster.config import Settings, settings


def use_database_url(args: argparse.Namespace, *, embedded: bool = False) -> None:
    """Make ``--database-url`` (or ``RECON_DATABASE_URL``) the URL every part of this process and
    its children use, validated before anything else runs.

    ``embedded`` (the demo, ``dev``): with neither given, start (or join) the embedded PostgreSQL and
    hand its URL on the same way, so the daemon, code server and run workers ``dev`` starts use it
    without opting in themselves. Every other command needs a URL (``DatabaseNotConfigured``)."""
    from recon_dagster.db.engine import DATABASE_URL_ENV, normalize_url, resolve_database_url

    given = getattr(args, "database_url", None)
    configured = given or settings().database_url
    if configured:
        os.environ[DATABASE_URL_ENV] = normalize_url(configured)  # raises InvalidDatabaseUrl
    elif embedded:
        os.environ[DATABASE_URL_ENV] = resolve_database_url(allow_embedded=True)


def require_migrated() -> str:
    """The resolved database URL, once the database answers and has every migration applied."""
    import sqlalchemy as sa

    from recon_dagster.db.engine import describe, get_engine, resolve_database_url
    from recon_dagster.db.grants import check_grants
    from recon_dagster.db.migrate import BOOKKEEPING_TABLE, MigrationError, discover

    url = resolve_database_url()
    with get_engine(url).connect() as conn:
        check_grants(conn)  # the runtime role's privileges: one line naming a missing GRANT
        tracked = conn.execute(sa.text(f"SELECT to_regclass('{BOOKKEEPING_TABLE}') IS NOT NULL")).scalar()
        applied = (
            set(conn.execute(sa.text(f"SELECT version FROM {BOOKKEEPING_TABLE}")).scalars())
            if tracked
            else set()
        )
    try:
        pending = [m.name for m in discover() if m.version not in applied]
    except MigrationError:  # installed without the migrations folder: trust the bookkeeping table
        pending = []
    if not tracked or pending:
        detail = "no migrations applied" if not tracked or not applied else f"pending: {', '.join(pending)}"
        raise CliError(f"database {describe(url)} is not migrated ({detail})", FIX_MIGRATE)
    return url


# --- commands ----------------------------------------------------------------------------------------


def _cmd_migrate(args: argparse.Namespace) -> int:
    from recon_dagster.db.engine import describe, get_engine, normalize_url, redact
    from recon_dagster.db.migrate import DEFAULT_RETRY_FOR_S, MigrationError, migrate, resolve_migrate_url

    # --database-url, else its own URL when set (PostgreSQL itself, the owner role), else the app's.
    url, source = (
        (normalize_url(args.database_url), "--database-url") if args.database_url else resolve_migrate_url()
    )
    if args.plan:
        from recon_dagster.db.migration_plan import plan, render

        print(render(plan(get_engine(url)), describe(url)))
        return 0

    def say(line: str) -> None:
        print(f"migrate: {line}", file=sys.stderr, flush=True)

    try:
        retry_for = DEFAULT_RETRY_FOR_S if args.retry_for is None else args.retry_for
        applied = migrate(get_engine(url), retry_for_s=retry_for, say=say, source=source)
    except MigrationError as exc:
        for line in exc.details:  # the baseline's gaps, one line each, before the one-line error
            print(f"migrate: gap: {line}", file=sys.stderr)
        raise
    if applied:
        print(f"migrate: applied {len(applied)} migration(s) to {redact(url)}: {', '.join(applied)}")
    else:
        print(f"migrate: {redact(url)} is up to date")
    return 0


def _cmd_sandbox(args: argparse.Namespace) -> int:
    from recon_dagster.sandbox import serve_forever

    try:
        serve_forever(args.host, args.port, args.latency)
    except OSError as exc:
        # strerror: the sandbox's own "cannot listen on host:port: <reason>" (or the OS reason).
        reason = (exc.strerror or str(exc)).rpartition(": ")[2]
        raise CliError(f"cannot listen on {args.host}:{args.port}: {reason}", "pick another --port") from exc
    return 0


def _cmd_reconcile(args: argparse.Namespace) -> int:
    if not args.once:
        raise CliError(
            "--once is required (continuous reconciliation is the Dagster daemon's job)",
            "run `recon-dagster reconcile --once`, or `recon-dagster dev` for the daemon",
            code=2,
        )
    require_migrated()
    from recon_dagster.cli.once import run_reconcile_once
    from recon_dagster.providers.limits import verify_account_budgets

    verify_account_budgets()  # a budget that differs from the account's refuses to start

    return run_reconcile_once(sweep=not args.no_sweep, debug=args.debug)


def _cmd_status(args: argparse.Namespace) -> int:
    require_migrated()
    from recon_dagster.operator.status import print_status

    return print_status()


def _cmd_demo(args: argparse.Namespace) -> int:
    from recon_dagster.cli.demo import run_demo

    return run_demo(serve=args.serve, port=args.port, verbose=args.verbose or args.debug)


def _cmd_explain(args: argparse.Namespace) -> int:
    from recon_dagster.operator.explain import explain_command

    return explain_command(args.job_id, as_json=args.json)


def _cmd_plan(args: argparse.Namespace) -> int:
    require_migrated()
    from recon_dagster.cli.plan import run_plan

    return run_plan(
        kind=args.kind,
        as_json=args.json,
        no_poll=args.no_poll,
        shadow_report=args.shadow_report,
        limit=args.limit,
    )


def _cmd_orphans(args: argparse.Namespace) -> int:
    require_migrated()
    from recon_dagster.cli.orphans import run_hand_action, run_orphans

    if args.adopt is not None or args.cancel is not None or args.job is not None:
        if args.act or args.json:
            raise CliError("--adopt / --cancel act on one task", "drop --act and --json", code=2)
        return run_hand_action(
            adopt=args.adopt, job=args.job, cancel=args.cancel, since=args.since, reason=args.reason
        )
    return run_orphans(as_json=args.json, since=args.since, act=args.act)


def _cmd_retry(args: argparse.Namespace) -> int:
    return _operator_action(args, "retry")


def _cmd_fail(args: argparse.Namespace) -> int:
    return _operator_action(args, "fail")


def _operator_action(args: argparse.Namespace, action: str) -> int:
    require_migrated()
    from recon_dagster.db.engine import get_engine, resolve_database_url
    from recon_dagster.operator.actions import OperatorError, fail_now, os_user, retry_now

    engine = get_engine(resolve_database_url())
    try:
        if action == "retry":
            done = retry_now(engine, args.job_id, who=os_user(), why=args.reason or "")
        else:
            from recon_dagster.providers import providers_from_env

            # Its upstream task is cancelled where the provider can (else handed to the orphan sweep).
            providers = providers_from_env()
            try:
                done = fail_now(engine, args.job_id, who=os_user(), reason=args.reason, providers=providers)
            finally:
                providers.close()
    except OperatorError as exc:
        raise CliError(str(exc), f"see `recon-dagster explain {args.job_id}`") from None
    print(f"{action}: {done.line}")
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    from pathlib import Path

    from recon_dagster.cli.proctree import run_process_tree
    from recon_dagster.db.engine import get_engine, resolve_database_url
    from recon_dagster.db.migrate import migrate
    from recon_dagster.operator.instance import dagster_dev_argv, prepare_dagster_home

    require_installed("dagster_webserver", "webserver", "`dagster dev`")
    url = resolve_database_url()
    migrate(get_engine(url))
    env = dict(os.environ)
    if not env.get("DAGSTER_HOME"):
        env.update(prepare_dagster_home(Path.cwd() / ".recon" / "dagster_home", url))
    extra = args.dagster_args[1:] if args.dagster_args[:1] == ["--"] else args.dagster_args
    cmd = dagster_dev_argv(Path(env["DAGSTER_HOME"]), extra)
    # Its own process group, stopped whole on SIGTERM / SIGINT (webserver, daemon, code server).
    return run_process_tree(cmd, env=env)


# --- parser -------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line too: ``recon-dagster <cmd>: <problem>; see `... --help```, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see `{self.prog} --help`\n")


def _common(p: argparse.ArgumentParser, *, database: bool) -> None:
    # SUPPRESS: a subcommand's default must not overwrite a --debug given before the subcommand.
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    if database:
        p.add_argument("--database-url", help=f"the app's PostgreSQL (default: {Settings.database_url.name})")


def _command(
    sub: argparse._SubParsersAction[_Parser],
    name: str,
    func: Callable[[argparse.Namespace], int],
    help: str,
    *,
    database: bool,
    embedded: bool = False,
) -> argparse.ArgumentParser:
    """A subcommand; ``embedded``: with no database URL it starts the embedded PostgreSQL (demo, dev)."""
    p = sub.add_parser(name, help=help)
    _common(p, database=database)
    p.set_defaults(func=func, uses_database=database, embedded_database=embedded)
    return p


def _version() -> str:
    """The installed distribution's version and Dagster's (what a bug report needs first)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("recon_dagster")
    except PackageNotFoundError:
        ours = "(not installed)"
    try:
        dagster = version("dagster")
    except PackageNotFoundError:
        dagster = "?"
    return f"{ours} (dagster {dagster})"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="recon-dagster",
        description="Reconcile external provider calls that outlived the worker that made them.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--debug", action="store_true", help=f"show tracebacks (also {DEBUG_ENV}=1)")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    mg = _command(sub, "migrate", _cmd_migrate, "apply migrations/ to the database", database=True)
    mg.add_argument(
        "--plan",
        action="store_true",
        help="list the pending statements, the lock each takes and the app tables they touch; write nothing",
    )
    mg.add_argument(
        "--retry-for",
        type=float,
        default=None,
        metavar="SECONDS",
        help="keep retrying a statement refused its lock (lock_timeout) this long (default 900)",
    )

    s = _command(sub, "sandbox", _cmd_sandbox, "serve the loopback provider sandbox", database=False)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8787)
    s.add_argument("--latency", type=float, default=0.0, help="seconds added to every provider call")

    r = _command(
        sub,
        "reconcile",
        _cmd_reconcile,
        "evaluate the sensor and run what it asks, in-process",
        database=True,
    )
    r.add_argument("--once", action="store_true", help="one tick, then exit")
    r.add_argument("--no-sweep", action="store_true", help="skip the sync sweep after the sensor's runs")

    _command(
        sub, "status", _cmd_status, "in-flight, stale and due jobs per provider kind, and why", database=True
    )

    ex = _command(
        sub,
        "explain",
        _cmd_explain,
        "one job's whole story: attempts, run links, upstream, credits",
        database=True,
    )
    ex.add_argument("job_id", help="the app's jobs.id (a UUID)")
    ex.add_argument("--json", action="store_true", help="print JSON instead of text")

    pl = _command(
        sub,
        "plan",
        _cmd_plan,
        "what the next tick would do to every job and credit; writes nothing",
        database=True,
    )
    pl.add_argument("--kind", help="only this provider kind")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pl.add_argument(
        "--no-poll", action="store_true", help="decide only what the rows decide; ask no provider"
    )
    pl.add_argument(
        "--limit", type=int, default=None, help=f"most jobs scanned (default: {Settings.scan_limit.name})"
    )
    pl.add_argument(
        "--shadow-report", action="store_true", help="instead: shadow decisions against what happened since"
    )
    orph = _command(
        sub,
        "orphans",
        _cmd_orphans,
        "upstream tasks no in-flight job owns: ours to adopt or cancel, unknown ones reported",
        database=True,
    )
    orph.add_argument("--json", action="store_true", help="print JSON instead of text")
    orph.add_argument(
        "--since",
        metavar="DURATION",
        help=f"list tasks created this long ago (30m, 6h, 2d; default {Settings.orphan_window_s.name})",
    )
    orph.add_argument(
        "--act",
        action="store_true",
        help="adopt, cancel and report (shadowed kinds: record); without it nothing is written",
    )
    # The operator's word on a probably_ours task (recon_dagster.operator.orphans): recorded with who and why.
    orph.add_argument("--adopt", metavar="TASK", help="adopt this probably_ours task onto --job JOB")
    orph.add_argument("--job", metavar="JOB", help="the in-flight job (jobs.id) that takes the --adopt task")
    orph.add_argument("--cancel", metavar="TASK", help="cancel this probably_ours task upstream")
    orph.add_argument("--reason", default="", help="why (recorded with the job) for --adopt / --cancel")
    # The operator's actions on one job (recon_dagster.operator.actions): recorded with who and why.
    rt = _command(
        sub,
        "retry",
        _cmd_retry,
        "make one in-flight job due now (the attempt is still counted)",
        database=True,
    )
    rt.add_argument("job_id", help="the app's jobs.id (a UUID)")
    rt.add_argument("--reason", default="", help="why (recorded with the job)")
    fl = _command(
        sub, "fail", _cmd_fail, "fail one in-flight job and refund its reserved credits", database=True
    )
    fl.add_argument("job_id", help="the app's jobs.id (a UUID)")
    fl.add_argument("--reason", required=True, help="why (recorded with the job and in its error)")

    dv = _command(
        sub,
        "dev",
        _cmd_dev,
        "`dagster dev` on this code location, with instance storage on the app's PostgreSQL "
        "(the embedded one when no URL is set)",
        database=True,
        embedded=True,
    )
    dv.add_argument("dagster_args", nargs=argparse.REMAINDER, help="passed on to `dagster dev`")

    d = _command(
        sub,
        "demo",
        _cmd_demo,
        "embedded PostgreSQL (when no URL is set) + sandbox + the incident, reconciled",
        database=True,
        embedded=True,
    )
    d.add_argument("--serve", action="store_true", help="then keep the sandbox up and start `dagster dev`")
    d.add_argument("--port", type=int, default=0, help="sandbox port (0: any free port)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand it was given to, like every other usage error
        _Parser(prog=f"{parser.prog} {args.command}").error(f"unrecognized arguments: {' '.join(extra)}")
    args.debug = args.debug or settings().debug
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # Dagster's console logger is DEBUG by default; keep the per-job outcome lines (INFO).
        logging.getLogger("dagster").setLevel(logging.INFO)
    try:
        if not args.debug:
            quiet_dagster_warnings()
        if args.uses_database:
            use_database_url(args, embedded=args.embedded_database)
            from recon_dagster.defs.settings_check import validate_settings

            validate_settings()  # every RECON_* setting, before anything runs
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place a failure becomes the user's one line
        if args.debug:
            raise
        err = as_cli_error(exc)
        print(f"recon-dagster {args.command}: {err.what}; {err.fix}", file=sys.stderr)
        return err.code
