"""``recon-dagster status``: per provider kind, what is in flight, what is stale, what the next
sensor tick would take (due), and why a stale job is not due: leased by a run, waiting out the
reconcile cadence (with the next attempt's time), or not yet at its first provider call.

"Due" is the stale scan itself (``scan_stale``), so this never disagrees with the sensor.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from recon_dagster.config import settings
from recon_dagster.db.engine import get_engine
from recon_dagster.db.jobs import inflight_counts, readable, scan_stale
from recon_dagster.providers.resource import not_configured, not_configured_line

# Status reads the whole due set; a bound keeps a pathological backlog from loading millions.
_DUE_LIMIT = 100_000

# A time Python cannot hold (a year past 9999, infinity) is left out of the shown min/max; the
# counts still include its row (the sweep clamps such a wait, see reconcile.poison).
_WAITS_SQL = f"""
SELECT COALESCE(provider_kind, '(none)') AS provider_kind,
       count(*) FILTER (WHERE reconcile_next_at > now()
                          AND (reconcile_lease_expires_at IS NULL OR reconcile_lease_expires_at <= now()))
         AS cadence,
       min(reconcile_next_at) FILTER (WHERE reconcile_next_at > now() AND {readable("reconcile_next_at")})
         AS next_at,
       max(reconcile_lease_expires_at) FILTER (
         WHERE reconcile_lease_expires_at > now() AND {readable("reconcile_lease_expires_at")}) AS lease_until
FROM jobs
WHERE status IN ('pending', 'processing')
GROUP BY 1
"""


# Jobs waiting because their last poll was never sent (the account's limiter refused it): their
# latest reconcile event is ``not_sent``, its reason the detail's first word.
_NOT_SENT_SQL = """
SELECT COALESCE(j.provider_kind, '(none)') AS provider_kind, split_part(e.detail, ':', 1) AS reason,
       count(*) AS n
FROM jobs j
CROSS JOIN LATERAL (
  SELECT outcome, detail FROM reconcile_events ev WHERE ev.job_id = j.id ORDER BY ev.id DESC LIMIT 1
) e
WHERE j.status IN ('pending', 'processing') AND j.reconcile_next_at > now()
  AND (j.reconcile_lease_expires_at IS NULL OR j.reconcile_lease_expires_at <= now())
  AND e.outcome = 'not_sent'
GROUP BY 1, 2
"""


def kind_status(conn: sa.Connection) -> list[dict[str, Any]]:
    """One dict per kind in flight: inflight, stale, due, leased, cadence, not_sent (with
    not_sent_reasons), precall, attempts, next_at, lease_until (cadence: waiting after a counted
    attempt; not_sent: rescheduled after a poll the account's limiter never let out, no attempt
    counted; precall: stale, and none of the others)."""
    due = Counter(r.provider_kind or "(none)" for r in scan_stale(conn, _DUE_LIMIT))
    waits = {r["provider_kind"]: r for r in conn.execute(sa.text(_WAITS_SQL)).mappings()}
    unsent: dict[str, Counter[str]] = {}
    for u in conn.execute(sa.text(_NOT_SENT_SQL)).mappings():
        unsent.setdefault(u["provider_kind"], Counter())[u["reason"]] += int(u["n"])
    rows = []
    for r in inflight_counts(conn):
        kind = r["provider_kind"]
        w: dict[str, Any] = dict(waits.get(kind) or {})
        reasons = unsent.get(kind, Counter())
        not_sent = sum(reasons.values())
        row = {
            **r,
            "due": due[kind],
            "cadence": max(0, int(w.get("cadence") or 0) - not_sent),
            "not_sent": not_sent,
            "not_sent_reasons": dict(reasons),
            "next_at": w.get("next_at"),
            "lease_until": w.get("lease_until"),
            "attempts": int(r["max_attempts"] or 0),
        }
        waiting = row["due"] + row["leased"] + row["cadence"] + not_sent
        row["precall"] = max(0, row["stale"] - waiting)
        rows.append(row)
    return rows


def _clock(ts: datetime | None, now: datetime, *, table: bool = True) -> str:
    if ts is None:
        return "-"
    secs = max(0, int((ts - now).total_seconds()))
    at, wait = f"{ts.astimezone(UTC):%H:%M:%S}", f"in {secs // 60}m{secs % 60:02d}s"
    return f"{at} ({wait})" if table else f"at {at} UTC, {wait}"


def explain(row: dict[str, Any], now: datetime) -> str | None:
    """Why the kind's stale jobs are not all due, one reason a line; None when every stale job is due."""
    if row["stale"] <= row["due"]:
        return None
    parts = []
    if row["leased"]:
        parts.append(
            f"{row['leased']} leased by a running reconcile run (lease ends {_clock(row['lease_until'], now, table=False)})"
        )
    if row["cadence"]:
        parts.append(
            f"{row['cadence']} waiting out the reconcile cadence (next attempt {_clock(row['next_at'], now, table=False)})"
        )
    if row["not_sent"]:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(row["not_sent_reasons"].items()))
        parts.append(
            f"{row['not_sent']} rescheduled after a poll the account's limiter never let out ({reasons}): "
            "no attempt counted, due again once the account lets polls out"
        )
    if row["precall"]:
        parts.append(f"{row['precall']} with no provider call yet (the sweep waits out the pre-call budget)")
    return f"{row['provider_kind']}: {row['stale'] - row['due']} stale, not due:" + "".join(
        f"\n  {p}" for p in parts
    )


def print_status() -> int:
    with get_engine().connect() as conn:
        rows = kind_status(conn)
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
    if not rows:
        print("no jobs in flight")
        for provider in not_configured():
            print(not_configured_line(provider))
        return 0
    cap = settings().max_attempts
    header = (
        f"{'provider_kind':<20} {'inflight':>8} {'stale':>5} {'due':>3} {'leased':>6} {'cadence':>7} "
        f"{'notsent':>7} {'precall':>7} {'attempts':>8}  next attempt (UTC)"
    )
    print(header)
    print("-" * 100)
    for r in rows:
        attempts = f"{r['attempts']}/{cap}"
        print(
            f"{r['provider_kind']:<20} {r['inflight']:>8} {r['stale']:>5} {r['due']:>3} {r['leased']:>6} "
            f"{r['cadence']:>7} {r['not_sent']:>7} {r['precall']:>7} {attempts:>8}  {_clock(r['next_at'], now)}"
        )
    notes = [line for r in rows if (line := explain(r, now))]
    print(
        "\nstale: past its kind's threshold; due: the next sensor tick takes it;\n"
        "notsent: rescheduled after a poll the account's limiter never let out (not an attempt)"
        + ("" if notes else "; every stale job is due")
    )
    for line in notes:
        print(line)
    for provider in not_configured():
        print(not_configured_line(provider))
    return 0
