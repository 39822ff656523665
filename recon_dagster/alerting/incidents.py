"""Incidents: one alert when something turns red, one when it turns green again (pure).

The alert sensor reads *signals* (a check evaluation, a failed or a successful run) in the order
they happened and hands each to an ``IncidentBook``. A failing signal opens the incident named by
its key, unless it is open already: one alert per incident, not one per run or per evaluation. A
passing signal resolves an open incident. A signal may name a *parent* incident that absorbs it
while that one is open; a signal that is not ``standalone`` is only ever evidence for its parent: a
reconcile run that failed because its provider did not answer is part of the provider's health
incident (which its own run evaluated just before failing), never a second page. A failing signal
that carries *news* (a force-fail at the cap newer than the one told) is told again while its
incident is open: giving up on a job is never quiet.

The book's state is plain JSON (the sensor keeps it in its cursor, so it survives restarts); it
holds keys, titles and counts, never a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

Action = Literal["trigger", "resolve"]
Severity = Literal["critical", "error", "warning", "info"]


@dataclass(frozen=True)
class Alert:
    """What every target is given (and ``RECON_ALERT_HOOK`` too): one incident opening or resolving."""

    action: Action
    key: str  # the incident: "check:<asset>:<check>" or "runs:<job>:<provider or kind>"
    title: str  # one line
    summary: str  # what is wrong (or that it is over), one or two lines
    severity: Severity = "error"
    provider: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()  # (text, url)
    at: str = ""  # ISO 8601, UTC
    source: str = "recon_dagster"
    first_step: str = ""  # what to do first (``recon_dagster.alerting.runbook``)
    runbook: str = ""  # its section of docs/operations.md, when RECON_ALERT_RUNBOOK_BASE_URL is set

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["links"] = [{"text": t, "href": u} for t, u in self.links]
        data["details"] = dict(self.details)
        return data


@dataclass(frozen=True)
class Signal:
    """One thing the sensor read: ``failing`` opens (or keeps open) ``key``, passing resolves it."""

    key: str
    failing: bool
    title: str
    summary: str
    at: float  # epoch seconds
    severity: Severity = "error"
    provider: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()
    parent: str | None = None  # an incident that absorbs this signal while it is open
    # False: the signal is only evidence for its parent (counted while the parent is open, nothing
    # otherwise), never an incident of its own.
    standalone: bool = True
    # What is new in this failure (e.g. the newest force-fail's id): a failing signal for an open
    # incident whose ``news`` differs from the last one told is told again (same key, "trigger":
    # PagerDuty folds it into the open alert, Slack and Teams get one more message).
    news: str | None = None


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


class IncidentBook:
    """The open incidents, keyed; ``observe`` returns the alerts a signal causes (zero or one)."""

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        self.open: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (state or {}).items()}

    def state(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self.open.items()}

    def is_open(self, key: str) -> bool:
        return key in self.open

    def observe(self, s: Signal) -> list[Alert]:
        if s.failing:
            if s.key in self.open:
                self._seen_again(s.key, s.at)
                told = self.open[s.key]
                if s.news is None or s.news == told.get("news"):
                    return []
                told["news"] = s.news
                return [self._trigger(s)]
            if s.parent is not None and s.parent in self.open:
                self._seen_again(s.parent, s.at, absorbed=s.key)
                return []
            if not s.standalone:
                return []
            self.open[s.key] = {
                "title": s.title,
                "since": s.at,
                "last": s.at,
                "count": 1,
                "provider": s.provider,
                "severity": s.severity,
                **({"news": s.news} if s.news is not None else {}),
            }
            return [self._trigger(s)]
        incident = self.open.pop(s.key, None)
        if incident is None:
            return []
        minutes = max(0.0, s.at - float(incident["since"])) / 60
        seen = int(incident.get("count", 1))
        return [
            Alert(
                "resolve",
                s.key,
                f"resolved: {incident['title']}",
                f"{s.summary} (open {minutes:.0f} min, seen failing {seen} time(s))",
                incident.get("severity", "error"),
                incident.get("provider"),
                {**dict(s.details), "open_minutes": round(minutes, 1), "times_seen_failing": seen},
                s.links,
                _iso(s.at),
            )
        ]

    @staticmethod
    def _trigger(s: Signal) -> Alert:
        return Alert(
            "trigger", s.key, s.title, s.summary, s.severity, s.provider, dict(s.details), s.links, _iso(s.at)
        )

    def _seen_again(self, key: str, at: float, absorbed: str | None = None) -> None:
        incident = self.open[key]
        incident["count"] = int(incident.get("count", 1)) + 1
        incident["last"] = max(float(incident.get("last", at)), at)
        if absorbed is not None:
            incident["absorbed"] = sorted({*incident.get("absorbed", []), absorbed})[:20]
