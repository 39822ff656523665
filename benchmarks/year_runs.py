"""What ``year.py`` shares for Dagster's run history: a sampled day's real runs, re-dated to their
simulated day and kept as a template, then cloned in bulk with SQL into every bulk-seeded day, so
that each world's Dagster instance holds a year's volume of runs and event-log rows. Not a
benchmark of its own (no ``main``).

The clone is made in dagster-postgres's own tables, every one that holds a run's rows: ``runs``
(the serialized run in ``run_body`` names its id), ``run_tags``, ``event_logs`` (each serialized
event names its run and carries its timestamp), ``asset_event_tags`` (the asset events' tags, by
event storage id) and ``asset_check_executions``. A clone gets a new run id (``md5(old id || day)``
as a uuid, in every column and serialized body that names the old one), new event storage ids in
the template's order, and every timestamp shifted by the days between the template's day and its
own (the columns and the events' serialized ``timestamp``). ``asset_keys`` (one row an asset, its
latest materialization) and ``dynamic_partitions`` are not per run and are left alone. So Dagster
reads a clone as any run (``get_runs``, the UI's run page) and ``delete_run`` removes it with its
events and their tags, as it would a real one: ``check_clone`` and ``check_deleted`` verify both.

The template lives in its own schema, ``bench``, in the same database; the Dagster sizes printed
leave it out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import dagster as dg
import sqlalchemy as sa

# dagster-postgres's tables that hold rows of a run, in the order a clone is written.
RUN_TABLES = ("runs", "run_tags", "event_logs", "asset_event_tags", "asset_check_executions")
SERIALIZED = ("run_body", "event", "evaluation_event")  # text bodies that name the run id
EVENT_ID_COLUMNS = ("event_id", "evaluation_event_storage_id", "materialization_event_storage_id")
FLOAT_TIMES = ("start_time", "end_time")  # unix seconds (runs), the rest are TIMESTAMP columns
NEW_ID = "CAST(md5({t}.run_id || :salt) AS uuid)::text"
EVENT_TIME = (
    "jsonb_set(CAST({t}.event AS jsonb), '{{timestamp}}', "
    "to_jsonb(CAST(CAST({t}.event AS jsonb)->>'timestamp' AS float8) - :shift))::text"
)
WHERE = {
    "runs": "{t}.run_id = ANY(:ids)",
    "run_tags": "{t}.run_id = ANY(:ids)",
    "event_logs": "{t}.run_id = ANY(:ids)",
    "asset_event_tags": "{t}.event_id IN (SELECT id FROM event_logs WHERE run_id = ANY(:ids))",
    "asset_check_executions": "{t}.run_id = ANY(:ids)",
}


def _columns(conn: sa.Connection, table: str) -> list[tuple[str, str]]:
    return [
        (str(name), str(kind))
        for name, kind in conn.execute(
            sa.text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name = :t ORDER BY ordinal_position"
            ),
            {"t": table},
        )
    ]


def _expr(table: str, column: str, kind: str, t: str, *, clone: bool) -> str | None:
    """The value of ``column`` in a re-dated (``clone`` False) or cloned row of ``t`` (the source
    row's alias); None where it stays as it is."""
    ref = f"{t}.{column}"
    if column == "id":
        return f"{ref} - :lo + :base" if clone and table == "event_logs" else None
    if column == "run_id":
        return NEW_ID.format(t=t) if clone else None
    if column in EVENT_ID_COLUMNS and clone:
        return f"CASE WHEN {ref} BETWEEN :lo AND :hi THEN {ref} - :lo + :base ELSE {ref} END"
    if kind.startswith("timestamp"):
        return f"{ref} - make_interval(secs => :shift)"
    if column in FLOAT_TIMES:
        return f"{ref} - :shift"
    if column in SERIALIZED:
        body = EVENT_TIME.format(t=t) if column == "event" else ref
        if not clone:
            return body if column == "event" else None
        return f"replace({body}, {t}.run_id, {NEW_ID.format(t=t)})"
    return None


def redate(engine: sa.Engine, after_id: int, shift_s: float) -> list[str]:
    """Move the runs stored after ``runs.id`` ``after_id`` (one sampled day's, made in real time)
    ``shift_s`` seconds back, onto their simulated day: every timestamp of them and their events.
    Their run ids."""
    with engine.begin() as conn:
        ids = list(
            conn.execute(
                sa.text("SELECT run_id FROM runs WHERE id > :a ORDER BY id"), {"a": after_id}
            ).scalars()
        )
        for table in RUN_TABLES:
            sets = [
                f"{c} = {e}"
                for c, kind in _columns(conn, table)
                if (e := _expr(table, c, kind, "s", clone=False)) is not None and c != "id"
            ]
            if sets:
                where = WHERE[table].format(t="s")
                conn.execute(
                    sa.text(f"UPDATE {table} AS s SET {', '.join(sets)} WHERE {where}"),
                    {"ids": ids, "shift": shift_s},
                )
    return ids


def last_run_id(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT coalesce(max(id), 0) FROM runs")).scalar_one())


@dataclass
class Template:
    """One sampled day's runs, copied into ``bench``: what every bulk day's clone is made of."""

    day: datetime
    runs: int
    events: int
    lo: int  # the template's event storage ids, lowest and highest
    hi: int


def keep_template(engine: sa.Engine, ids: list[str], day: datetime) -> Template:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA IF NOT EXISTS bench"))
        for table in RUN_TABLES:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS bench.{table}"))
            conn.execute(
                sa.text(
                    f"CREATE TABLE bench.{table} AS SELECT * FROM {table} AS s WHERE {WHERE[table].format(t='s')}"
                ),
                {"ids": ids},
            )
        events, lo, hi = conn.execute(
            sa.text("SELECT count(*), coalesce(min(id), 0), coalesce(max(id), 0) FROM bench.event_logs")
        ).one()
    return Template(day, len(ids), int(events), int(lo), int(hi))


def clone(engine: sa.Engine, template: Template, day: datetime) -> float:
    """The template's runs, again, on simulated ``day``: one transaction. Its seconds."""
    t0 = time.monotonic()
    shift = (template.day - day).total_seconds()
    with engine.begin() as conn:
        span = template.hi - template.lo + 1
        # Reserve a block of event storage ids, as many as the template spans, in one step.
        base = conn.execute(
            sa.text(
                "SELECT setval(pg_get_serial_sequence('event_logs', 'id'), "
                "nextval(pg_get_serial_sequence('event_logs', 'id')) + :span) - :span"
            ),
            {"span": span},
        ).scalar_one()
        params = {
            "salt": f"/{day:%Y-%m-%d}",
            "shift": shift,
            "lo": template.lo,
            "hi": template.hi,
            "base": base,
        }
        for table in RUN_TABLES:
            cols, exprs = [], []
            for c, kind in _columns(conn, table):
                e = _expr(table, c, kind, "s", clone=True)
                if c == "id" and e is None:
                    continue  # a new serial id
                cols.append(c)
                exprs.append(e or f"s.{c}")
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(exprs)} "
                    f"FROM bench.{table} AS s ORDER BY s.id"
                ),
                params,
            )
    return time.monotonic() - t0


def clone_ids(template_ids: list[str], day: datetime) -> list[str]:
    """The run ids ``clone`` gave the template's runs on ``day`` (as its SQL computes them)."""
    import hashlib
    import uuid

    return [str(uuid.UUID(hashlib.md5(f"{r}/{day:%Y-%m-%d}".encode()).hexdigest())) for r in template_ids]


def template_ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT run_id FROM bench.runs ORDER BY id")).scalars())


def events_of(engine: sa.Engine, run_id: str) -> tuple[int, int]:
    """(event-log rows, asset event tags) of a run, read directly."""
    with engine.connect() as conn:
        return tuple(
            conn.execute(
                sa.text(
                    "SELECT (SELECT count(*) FROM event_logs WHERE run_id = :r), "
                    "(SELECT count(*) FROM asset_event_tags WHERE event_id IN "
                    "(SELECT id FROM event_logs WHERE run_id = :r))"
                ),
                {"r": run_id},
            ).one()
        )


def check_clone(instance: dg.DagsterInstance, engine: sa.Engine, run_id: str, original: str) -> str:
    """A clone is a run to Dagster: ``get_runs`` lists it under its new id, its event log reads
    back as the original's (same count, same types in order, shifted timestamps). Raises if not."""
    runs = instance.get_runs(filters=dg.RunsFilter(run_ids=[run_id]))
    if len(runs) != 1 or runs[0].run_id != run_id:
        raise RuntimeError(f"clone {run_id}: get_runs gave {[r.run_id for r in runs]}")
    mine = instance.all_logs(run_id)
    theirs = instance.all_logs(original)
    if [e.dagster_event_type for e in mine] != [e.dagster_event_type for e in theirs] or not mine:
        raise RuntimeError(f"clone {run_id}: {len(mine)} events, the original {len(theirs)}")
    if any(e.run_id != run_id for e in mine):
        raise RuntimeError(f"clone {run_id}: an event names another run")
    rows, tags = events_of(engine, run_id)
    shift_h = (theirs[0].timestamp - mine[0].timestamp) / 3600
    return (
        f"clone {run_id[:8]} of {original[:8]}: get_runs lists it ({runs[0].status.value}), "
        f"{len(mine)} events ({rows} rows, {tags} asset event tags), {shift_h:,.0f} h earlier"
    )


def check_deleted(
    instance: dg.DagsterInstance, engine: sa.Engine, run_id: str, before: tuple[int, int]
) -> str:
    """After ``delete_run`` (run retention's), nothing of the clone is left. Raises if something is."""
    left = events_of(engine, run_id)
    if instance.get_run_by_id(run_id) is not None or left != (0, 0):
        raise RuntimeError(f"clone {run_id}: still there after the pass ({left} event rows, tags)")
    with engine.connect() as conn:
        tags = conn.execute(
            sa.text("SELECT count(*) FROM run_tags WHERE run_id = :r"), {"r": run_id}
        ).scalar()
    if tags:
        raise RuntimeError(f"clone {run_id}: {tags} run tags left")
    return (
        f"clone {run_id[:8]} deleted by run retention with its {before[0]} event rows and "
        f"{before[1]} asset event tags, no run tags left"
    )


def storage(engine: sa.Engine) -> str:
    """Runs, event-log rows and the database's size without the template."""
    with engine.connect() as conn:
        runs, events, total, bench = conn.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM event_logs), "
                "pg_database_size(current_database()), "
                "(SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'bench' AND c.relkind = 'r')"
            )
        ).one()
    return f"{runs:,} runs, {events:,} event-log rows, database {(total - bench) / 2**20:,.1f} MiB"
