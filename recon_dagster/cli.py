"""``recon-dagster``: migrate, demo, sandbox, reconcile --once, status."""

from __future__ import annotations

import argparse
import logging
import sys


def _cmd_migrate(args: argparse.Namespace) -> int:
    from recon_dagster.db.migrate import migrate_command

    return migrate_command(args.database_url)


def _cmd_sandbox(args: argparse.Namespace) -> int:
    from recon_dagster.sandbox import serve_forever

    serve_forever(args.host, args.port, args.latency)
    return 0


def _cmd_reconcile(args: argparse.Namespace) -> int:
    if not args.once:
        print(
            "recon-dagster reconcile needs --once (continuous reconciliation is the Dagster daemon's "
            "job: run `dagster dev` or `dagster-daemon run`)",
            file=sys.stderr,
        )
        return 2
    from recon_dagster.once import reconcile_once

    report = reconcile_once(sweep=not args.no_sweep)
    if report.skip_reason and report.runs <= 1:
        print(f"sensor: {report.skip_reason}")
    print(report.line())
    return 1 if report.failed_runs else 0


def _cmd_status(args: argparse.Namespace) -> int:
    from recon_dagster.db.engine import get_engine
    from recon_dagster.db.jobs import inflight_counts

    with get_engine().connect() as conn:
        rows = inflight_counts(conn)
    if not rows:
        print("no jobs in flight")
        return 0
    header = f"{'provider_kind':<22} {'inflight':>8} {'stale':>6} {'leased':>6} {'max_attempts':>12}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['provider_kind']:<22} {r['inflight']:>8} {r['stale']:>6} {r['leased']:>6} "
            f"{r['max_attempts'] or 0:>12}"
        )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from recon_dagster.demo import run_demo

    return run_demo(serve=args.serve, port=args.port)


def _cmd_explain(args: argparse.Namespace) -> int:
    from recon_dagster.explain import explain_command

    return explain_command(args.job_id, as_json=args.json)


def _cmd_dev(args: argparse.Namespace) -> int:
    import os
    import subprocess
    from pathlib import Path

    from recon_dagster.db.engine import get_engine, resolve_database_url
    from recon_dagster.db.migrate import migrate
    from recon_dagster.instance import dagster_dev_argv, prepare_dagster_home

    url = resolve_database_url()
    migrate(get_engine(url))
    env = dict(os.environ)
    if not env.get("DAGSTER_HOME"):
        env.update(prepare_dagster_home(Path.cwd() / ".recon" / "dagster_home", url))
    extra = args.dagster_args[1:] if args.dagster_args[:1] == ["--"] else args.dagster_args
    cmd = dagster_dev_argv(Path(env["DAGSTER_HOME"]), extra)
    return subprocess.call(cmd, env=env)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recon-dagster",
        description="Reconcile external provider calls that outlived the worker that made them.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("migrate", help="apply migrations/ to the database")
    m.add_argument("--database-url", help="defaults to RECON_DATABASE_URL, else the embedded PostgreSQL")
    m.set_defaults(func=_cmd_migrate)

    s = sub.add_parser("sandbox", help="serve the loopback provider sandbox")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8787)
    s.add_argument("--latency", type=float, default=0.0, help="seconds added to every provider call")
    s.set_defaults(func=_cmd_sandbox)

    r = sub.add_parser("reconcile", help="evaluate the sensor and run what it asks, in-process")
    r.add_argument("--once", action="store_true", help="one tick, then exit")
    r.add_argument("--no-sweep", action="store_true", help="skip the sync sweep after the sensor's runs")
    r.set_defaults(func=_cmd_reconcile)

    st = sub.add_parser("status", help="in-flight and stale counts per provider kind")
    st.set_defaults(func=_cmd_status)

    ex = sub.add_parser("explain", help="one job's whole story: attempts, run links, upstream, credits")
    ex.add_argument("job_id", help="the app's jobs.id (a UUID)")
    ex.add_argument("--json", action="store_true", help="print JSON instead of text")
    ex.set_defaults(func=_cmd_explain)

    dv = sub.add_parser(
        "dev", help="`dagster dev` on this code location, with instance storage on the app's PostgreSQL"
    )
    dv.add_argument("dagster_args", nargs=argparse.REMAINDER, help="passed on to `dagster dev`")
    dv.set_defaults(func=_cmd_dev)

    d = sub.add_parser("demo", help="embedded PostgreSQL + sandbox + the incident, reconciled")
    d.add_argument("--serve", action="store_true", help="then keep the sandbox up and start `dagster dev`")
    d.add_argument("--port", type=int, default=0, help="sandbox port (0: any free port)")
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # Dagster's console logger is DEBUG by default; keep the per-job outcome lines (INFO).
        logging.getLogger("dagster").setLevel(logging.INFO)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a clear one-line error for operators; -v for the traceback
        if args.verbose:
            raise
        print(f"recon-dagster {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
