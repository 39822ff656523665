"""``active_incidents``: the alert sensor's open incidents as an asset of the on-call group, so the
Catalog shows what is paging now (what, since when, severity, the first step and its runbook)
rather than a sensor cursor's JSON. Dagster's Catalog sorts assets by name: this one is its first
row.

The sensor keeps its ``IncidentBook`` in its cursor as before; each tick in which the book changed
(an incident opened, resolved, or was told again) it also returns one materialization of this
asset (``SensorResult.asset_events``): the table of the incidents open after the tick, their count,
and what changed, with an evaluation of its check ``none_open`` (red while an incident is open, so
the Catalog shows it red; the sensor never alerts on this check of its own). The cursor remembers
what the last one showed (``shown``), so a tick whose result was lost shows it again and a tick
that changed nothing writes nothing.
"""

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from recon_dagster.alerting.runbook import DOC, runbook_for, runbook_url
from recon_dagster.defs.groups import ONCALL

OPEN_INCIDENTS = dg.AssetKey("active_incidents")
COUNT = "open incidents (count)"
NONE_OPEN = "none_open"
SENSOR = "reconcile_alerts"  # (``sensor.SENSOR_NAME``; the sensor imports this module)

active_incidents = dg.AssetSpec(
    OPEN_INCIDENTS,
    group_name=ONCALL,
    description="What is paging now: each incident the reconcile_alerts sensor holds open (what, since "
    "when, severity, how often seen failing, the first step and its runbook in docs/operations.md). "
    "Written by that sensor whenever an incident opens, resolves or is told again (not launched on "
    "its own); none open reads 'no open incident'.",
    automation_condition=dg.AutomationCondition.newly_updated().with_label(
        "written by the reconcile_alerts sensor when an incident opens or resolves"
    ),
    metadata={"written_by": "reconcile_alerts (sensor)", "materialized_on_its_own": False},
)

_COLUMNS = (
    ("incident", "string", "the incident's key: check:<asset>:<check> or runs:<job>:<provider>"),
    ("what", "string", "its title, as paged"),
    ("severity", "string", "error (pages), warning (degraded) or critical"),
    ("provider", "string", "the provider it is about, if any"),
    ("since", "string", "when it opened (UTC)"),
    ("open_min", "int", "minutes open at this materialization"),
    ("seen_failing", "int", "evaluations or runs seen failing while open"),
    ("first_step", "string", "what to do first"),
    ("runbook", "string", "its section of docs/operations.md"),
)


def signature(book: Mapping[str, Mapping[str, Any]]) -> str:
    """What the board shows of ``book``, as a string: it changes when an incident opens, resolves,
    changes title or severity or is told again (never with its count alone)."""
    return json.dumps(
        sorted(
            [k, str(v.get("title", "")), str(v.get("severity", "")), str(v.get("news", ""))]
            for k, v in book.items()
        )
    )


def _utc(at: Any) -> str:
    try:
        return datetime.fromtimestamp(float(at), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


def incident_rows(
    book: Mapping[str, Mapping[str, Any]], base_url: str | None, now: float
) -> list[dict[str, Any]]:
    """One row per open incident, the oldest first (pure)."""
    rows = []
    for key, incident in book.items():
        runbook = runbook_for(key)
        try:
            since = float(incident.get("since", now))
        except (TypeError, ValueError):
            since = now
        rows.append(
            {
                "incident": key,
                "what": str(incident.get("title", key)),
                "severity": str(incident.get("severity", "error")),
                "provider": str(incident.get("provider") or "-"),
                "since": _utc(since),
                "open_min": max(0, int((now - since) // 60)),
                "seen_failing": int(incident.get("count", 1)),
                "first_step": runbook.first_step,
                "runbook": runbook_url(base_url, runbook) or f"{DOC}#{runbook.anchor}",
                "_since": since,
            }
        )
    rows.sort(key=lambda r: (r["_since"], r["incident"]))
    for r in rows:
        del r["_since"]
    return rows


def _markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_no open incident_"
    head = "| what | severity | since | open | first step | runbook |\n|---|---|---|---|---|---|"
    body = [
        f"| {r['what']} (`{r['incident']}`) | {r['severity']} | {r['since']} | {r['open_min']} min | "
        f"{r['first_step'].replace('|', '/')} | [runbook]({r['runbook']}) |"
        for r in rows
    ]
    return "\n".join([head, *body])


def changes(before: Mapping[str, Any], after: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What a tick changed, one line each (pure): opened, resolved, told again."""
    lines = [f"opened {k}: {after[k].get('title', k)}" for k in sorted(set(after) - set(before))]
    lines += [f"resolved {k}" for k in sorted(set(before) - set(after))]
    lines += [
        f"told again {k}: {after[k].get('title', k)}"
        for k in sorted(set(before) & set(after))
        if after[k].get("news") != dict(before[k]).get("news")
    ]
    return lines


def board_event(
    before: Mapping[str, Any], after: Mapping[str, Mapping[str, Any]], *, base_url: str | None, now: float
) -> dg.AssetMaterialization:
    """The materialization of ``active_incidents`` after a tick that changed the book (pure)."""
    rows = incident_rows(after, base_url, now)
    changed = changes(before, after) or ["shown again"]
    return dg.AssetMaterialization(
        asset_key=OPEN_INCIDENTS,
        description="; ".join(changed)[:1000],
        metadata={
            COUNT: dg.MetadataValue.int(len(rows)),
            "incidents": dg.MetadataValue.md(_markdown(rows)),
            "table": dg.MetadataValue.table(
                records=[dg.TableRecord(r) for r in rows],
                schema=dg.TableSchema(columns=[dg.TableColumn(n, t, description=d) for n, t, d in _COLUMNS]),
            ),
            "changed": "; ".join(changed)[:1000],
        },
    )


def check_evaluation(book: Mapping[str, Mapping[str, Any]]) -> dg.AssetCheckEvaluation:
    """``none_open``'s verdict on ``book`` (pure): red while an incident is open, at WARN when
    every open one is a warning (a degraded provider)."""
    severities = {str(v.get("severity", "error")) for v in book.values()}
    titles = sorted(str(v.get("title", k)) for k, v in book.items())
    return dg.AssetCheckEvaluation(
        asset_key=OPEN_INCIDENTS,
        check_name=NONE_OPEN,
        passed=not book,
        severity=dg.AssetCheckSeverity.WARN if severities == {"warning"} else dg.AssetCheckSeverity.ERROR,
        description=(f"{len(book)} open: " + "; ".join(titles))[:1000] if book else "no open incident",
        metadata={COUNT: len(book), "incidents": dg.MetadataValue.json(sorted(book))},
    )


def cursor_book(instance: dg.DagsterInstance) -> dict[str, Any]:
    """The open incidents in the alert sensor's cursor (empty when it has none or cannot be read)."""
    for state in instance.all_instigator_state():
        if state.instigator_name != SENSOR:
            continue
        try:
            return dict(json.loads(getattr(state.instigator_data, "cursor", None) or "{}").get("open") or {})
        except (ValueError, AttributeError, TypeError):
            return {}
    return {}


@dg.asset_check(
    asset=OPEN_INCIDENTS,
    name=NONE_OPEN,
    description="Red while the reconcile_alerts sensor holds an incident open (WARN when every open one "
    "is a warning): evaluated by the sensor whenever an incident opens or resolves; Execute reads its "
    "cursor now. The sensor never alerts on this check (it would page about its own pages).",
)
def none_open(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    evaluation = check_evaluation(cursor_book(context.instance))
    return dg.AssetCheckResult(
        passed=evaluation.passed,
        severity=evaluation.severity,
        description=evaluation.description,
        metadata=dict(evaluation.metadata),
    )


def board_events(
    state: dict[str, Any], before: Mapping[str, Any], *, base_url: str | None, now: float
) -> list[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """The tick's ``active_incidents`` materialization, if what it shows changed since the last one
    (``state["shown"]`` in the cursor, updated here); none otherwise."""
    shown = signature(state["open"])
    if state.get("shown") == shown:
        return []
    state["shown"] = shown
    return [board_event(before, state["open"], base_url=base_url, now=now), check_evaluation(state["open"])]
