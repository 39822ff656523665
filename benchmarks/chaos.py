"""The fault harness, full run: SIGKILL at every named crash point, recover through the real CLI.

For each crash point (``recon_dagster.core.crashpoints``) on each path that reaches it (an app worker
process, or ``recon-dagster reconcile --once``), ``--rounds`` rounds of ``--jobs`` jobs: one process
works a round's jobs at once and dies by SIGKILL with every job parked at the point; the clock moves
a day and ``reconcile --once`` runs until nothing is in flight; then every job is checked (see
``recon_dagster_tests/chaos/harness.py``). Faults too: ``sandbox.outage`` (429/5xx bursts past the
worker's retries) and, with ``--postgres-restart``, the embedded PostgreSQL stopped and started
under a running worker; with ``--header-drip``, a host that drips its response headers a line a
second under ``reconcile --once`` (``recon_dagster_tests/chaos/headerdrip.py``).

Prints one line per round, then the Jepsen-style table per point (Markdown) and a JSON line.
Exits 1 if any invariant was violated.

    .venv/bin/python benchmarks/chaos.py [--rounds 10] [--jobs 20] [--seed 1] [--cases worker:refund.in_settle,...]
        [--database-url URL] [--postgres-restart] [--header-drip] [--keep]

200 trials per point = ``--rounds 10 --jobs 20`` (the default). Each round is reproducible from its
seed (printed): ``--seed S --rounds 1 --cases <path>:<point>`` replays campaign S's first round.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recon_dagster_tests.chaos

from recon_dagster.db.engine import (
    DATABASE_URL_ENV,
    get_engine,
    normalize_url,
    redact,
    resolve_database_url,
    with_database,
)
from recon_dagster.db.migrate import migrate
from recon_dagster_tests.chaos import checks, harness, runner, worlds
from recon_dagster_tests.support.instance import drop_database, ensure_database
from recon_dagster_tests.support.sandbox_process import sandbox_process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds (SIGKILLed processes) per point")
    parser.add_argument("--jobs", type=int, default=20, help="jobs (trials) per round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", default="", help="comma-separated <path>:<point> (default: all)")
    parser.add_argument(
        "--database-url", default=None, help="server (default RECON_DATABASE_URL, else embedded)"
    )
    parser.add_argument("--postgres-restart", action="store_true", help="also the PostgreSQL restart fault")
    parser.add_argument(
        "--header-drip", action="store_true", help="also the header-drip fault (a host dripping headers)"
    )
    parser.add_argument("--parallel", type=int, default=2, help="worker rounds run at once")
    parser.add_argument("--keep", action="store_true", help="keep the database and the work folder")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.jobs < 1:
        parser.error("--rounds and --jobs must be at least 1")
    known = {f"{p}:{q}" for p, q in worlds.CASES} | {"worker:postgres.restart", "reconcile:header.drip"}
    cases = worlds.CASES
    if args.cases:
        wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
        if "worker:postgres.restart" in wanted:
            wanted.remove("worker:postgres.restart")
            args.postgres_restart = True
        if "reconcile:header.drip" in wanted:
            wanted.remove("reconcile:header.drip")
            args.header_drip = True
        unknown = sorted(set(wanted) - known)
        if unknown:
            parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        cases = tuple(tuple(c.split(":", 1)) for c in wanted)  # type: ignore[misc]

    server_url = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_chaos_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    os.environ[DATABASE_URL_ENV] = url
    work = Path(tempfile.mkdtemp(prefix="recon-chaos-"))
    print(
        f"database {redact(url)}; seed {args.seed}; {len(cases)} cases x {args.rounds} rounds x "
        f"{args.jobs} jobs; logs in {work}",
        flush=True,
    )

    def progress(r: runner.RoundResult, total: checks.PointReport) -> None:
        print(
            f"{r.case:32} seed {r.seed}: rc={r.returncode} hits {r.hits}/{r.expected_hits} "
            f"{'killed at point' if r.killed_at_point else 'NOT killed at point'} {r.seconds:.1f}s; "
            f"so far {total.trials} trials, {total.violations} violations",
            flush=True,
        )

    try:
        engine = get_engine(url)
        migrate(engine)
        media_dir = work / "media"
        media_dir.mkdir()
        with sandbox_process(log_dir=work) as sandbox:
            campaign = harness.Campaign(args.seed, args.jobs, args.rounds, cases)
            if cases:
                campaign = harness.run_campaign(
                    engine, url, sandbox, media_dir, seed=args.seed, jobs_per_round=args.jobs,
                    rounds_per_case=args.rounds, cases=cases, workdir=work, progress=progress,
                    parallel=args.parallel, on_sweep=lambda c: print(f"\n{harness.table(c)}\n", flush=True),
                )  # fmt: skip
            if args.postgres_restart:
                from recon_dagster_tests.chaos.pgrestart import run_postgres_restart

                pg = run_postgres_restart(sandbox, work, seed=args.seed, jobs=args.jobs, rounds=args.rounds)
                campaign.reports[pg.case] = pg
            if args.header_drip:
                from recon_dagster_tests.chaos.headerdrip import run_header_drip

                drip = run_header_drip(
                    engine, url, sandbox, media_dir, work, seed=args.seed, jobs=args.jobs, rounds=args.rounds
                )
                campaign.reports[drip.case] = drip
        print()
        print(harness.table(campaign))
        print(f"\n{campaign.seconds:.0f} s, {campaign.recovery_passes} recovery passes")
        bad = {c: r for c, r in campaign.reports.items() if r.violations}
        for case, rep in bad.items():
            print(f"VIOLATIONS {case}: " + "; ".join(rep.examples))
        print(json.dumps({c: r.as_dict() for c, r in campaign.reports.items()}))
        return 1 if bad else 0
    finally:
        if not args.keep:
            from recon_dagster.db.engine import dispose_engines

            dispose_engines()
            drop_database(server_url, name)


if __name__ == "__main__":
    raise SystemExit(main())
