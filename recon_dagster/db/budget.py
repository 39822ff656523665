"""The connection budget on the app's database: ``RECON_DB_MAX_CONNECTIONS`` bounds every connection
recon_dagster's processes hold on it at once, all of them together.

Every process reaches the app's database through one pooled engine (``db/engine.py``) whose pool
never grows past the process's share:

- the code server (sensors and schedules; Dagster evaluates them there): ``CODE_SERVER_CONNECTIONS``;
- each run worker: ``(budget - CODE_SERVER_CONNECTIONS) // (max_concurrent_runs + 1)``, where
  ``max_concurrent_runs`` is the instance's run queue limit and the one more is an operator
  command (``reconcile --once``, ``status``, ...) running beside them; at least
  ``MIN_RUN_CONNECTIONS`` (a run's job threads take turns on them: 2 kept a 16-thread run as fast
  as 10 did, ``docs/benchmarks.md``), at most what a run's threads can use;
- any other process (an operator command, the app's workers through ``recon_dagster.worker``):
  ``OTHER_PROCESS_CONNECTIONS``; ``reconcile --once`` runs its runs in-process with a run's share,
  the one operator command the budget keeps room for.

The run queue follows the budget: an instance whose queue would let more runs start at once than
the budget has shares for is refused with one line saying what to set (``check_run_queue``), by
the sensor before it requests a run and by every run before it touches the database. Dagster's
own storage (``DAGSTER_POSTGRES_URL``, dagster-postgres: a connection per statement per process) is
not in this budget: it is another database, counted on its own.
"""

from __future__ import annotations

from recon_dagster.config import Settings, settings

BUDGET_ENV = Settings.db_max_connections.name
# Sensors evaluate on two threads (dagster.yaml: sensors.num_workers), each with one connection.
CODE_SERVER_CONNECTIONS = 2
MIN_RUN_CONNECTIONS = 2
# A process that is neither a run worker nor the code server: an operator command, an app worker.
OTHER_PROCESS_CONNECTIONS = 2
# More than a run's threads can hold is never used: its job threads, the op's own, the limiter's.
RUN_THREADS_BEYOND_CONCURRENCY = 4


def budget() -> int:
    """``RECON_DB_MAX_CONNECTIONS``."""
    return settings().db_max_connections


def most_runs_at_once(total: int | None = None) -> int:
    """The most runs the budget has a share for (``MIN_RUN_CONNECTIONS`` each), an operator command
    and the code server beside them: what ``run_queue.max_concurrent_runs`` may be at most."""
    total = budget() if total is None else total
    return (total - CODE_SERVER_CONNECTIONS) // MIN_RUN_CONNECTIONS - 1


def budget_for_runs(runs: int) -> int:
    """The smallest budget under which ``runs`` may run at once."""
    return CODE_SERVER_CONNECTIONS + (runs + 1) * MIN_RUN_CONNECTIONS


def check_run_queue(max_concurrent_runs: int | None, total: int | None = None) -> str | None:
    """Why an instance whose run queue lets ``max_concurrent_runs`` runs start at once (None or -1:
    no limit) cannot keep the budget, in one line; None when it can."""
    total = budget() if total is None else total
    most = most_runs_at_once(total)
    where = "dagster.yaml's run_queue.max_concurrent_runs"
    if max_concurrent_runs is None or max_concurrent_runs < 0:
        return (
            f"{BUDGET_ENV}={total} has connections for {most} runs at once, but the instance does not limit "
            f"its runs: use Dagster's QueuedRunCoordinator with {where} at most {most}"
        )
    if max_concurrent_runs > most:
        return (
            f"{BUDGET_ENV}={total} has connections for {most} runs at once ({MIN_RUN_CONNECTIONS} each, "
            f"{CODE_SERVER_CONNECTIONS} for the code server, one operator command), but {where} is "
            f"{max_concurrent_runs}: lower it to {most}, or raise {BUDGET_ENV} to "
            f"{budget_for_runs(max_concurrent_runs)}"
        )
    return None


def run_connections(max_concurrent_runs: int, concurrency: int, total: int | None = None) -> int:
    """A run worker's share: the budget left by the code server, split over the runs the queue lets
    start at once and one operator command, capped at what its threads can use. The caller has
    checked the queue (``check_run_queue``)."""
    total = budget() if total is None else total
    share = (total - CODE_SERVER_CONNECTIONS) // (max(max_concurrent_runs, 0) + 1)
    return max(MIN_RUN_CONNECTIONS, min(share, concurrency + RUN_THREADS_BEYOND_CONCURRENCY))
