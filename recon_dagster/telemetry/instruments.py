"""Every metric recon_dagster exports, declared once: name, type, unit, labels, meaning.

``docs/operations.md`` lists them from ``METRICS`` (a test keeps the two equal), the Prometheus
rules in ``deploy/prometheus/`` query them by ``prometheus_name``, and each is recorded through
``Metric.add`` / ``Metric.record``, which cost one attribute read while telemetry is off.

Labels are few and bounded: a kind or a provider outside the registry is ``other``, any value is cut
to ``MAX_LABEL_CHARS``, and a label a metric does not declare is dropped; a job id or a user never
is one (traces carry the job id, where it costs no series).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from recon_dagster.config import Settings
from recon_dagster.core.kinds import KINDS, provider_names

MetricType = Literal["counter", "histogram", "gauge", "observable_gauge"]
# Where a metric's value comes from: a long-lived process's reading of the database (scraped, and
# never lost with a run worker), or the process that did the work (pushed by OTLP at run end).
Source = Literal["database", "work"]
MAX_LABEL_CHARS = 40
OTHER = "other"
# Age buckets of in-flight jobs (the lower bounds, in seconds, and their label).
AGE_BUCKETS: tuple[tuple[float, str], ...] = (
    (0, "lt_15m"),
    (900, "15m_1h"),
    (3600, "1h_6h"),
    (6 * 3600, "6h_24h"),
    (24 * 3600, "ge_24h"),
)
# Seconds: limiter waits and sensor ticks (explicit buckets: the SDK's defaults are milliseconds).
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def age_bucket(age_s: float) -> str:
    """The ``age`` label of a job in flight for ``age_s`` seconds."""
    label = AGE_BUCKETS[0][1]
    for low, name in AGE_BUCKETS:
        if age_s >= low:
            label = name
    return label


@dataclass(frozen=True)
class Metric:
    """One instrument. ``name`` is OpenTelemetry's; ``prometheus_name`` what a scrape shows."""

    name: str
    type: MetricType
    unit: str  # UCUM: "s", or an annotation such as "{job}" (dropped from Prometheus names)
    labels: tuple[str, ...]
    meaning: str
    source: Source = "work"

    @property
    def prometheus_name(self) -> str:
        """The series name the Prometheus exporter gives it: ``_seconds`` for unit ``s``,
        ``_total`` for a counter (the test on a live scrape checks this rule)."""
        name = self.name.replace(".", "_")
        if self.unit == "s" and not name.endswith("_seconds"):
            name += "_seconds"
        return name + "_total" if self.type == "counter" else name

    def add(self, value: float, **labels: str | None) -> None:
        """Add to a counter (nothing while telemetry is off)."""
        instrument = _INSTRUMENTS.get(self.name)
        if instrument is not None:
            instrument.add(value, self.attributes(labels))

    def record(self, value: float, **labels: str | None) -> None:
        """Record a histogram's sample or a gauge's value (nothing while telemetry is off)."""
        instrument = _INSTRUMENTS.get(self.name)
        if instrument is not None:
            if self.type == "gauge":
                instrument.set(value, self.attributes(labels))
            else:
                instrument.record(value, self.attributes(labels))

    def attributes(self, labels: Mapping[str, str | None]) -> dict[str, str]:
        """The declared labels only, each bounded; ``provider`` filled in from ``kind``."""
        if "provider" in self.labels and not labels.get("provider") and labels.get("kind"):
            named = str(labels["kind"])  # a provider kind, or a provider's own name (a limiter's label)
            kind = KINDS.get(named)
            labels = {**labels, "provider": kind.provider if kind else named}
        return {name: bounded(name, labels.get(name)) for name in self.labels}


def bounded(label: str, value: object) -> str:
    """A label's value as exported: a kind or provider the registry does not know is ``other``."""
    if value is None or value == "":
        return "none"
    text = str(value)
    if label == "kind" and text not in KINDS:
        return OTHER
    if label == "provider" and text not in provider_names():
        return OTHER
    return text[:MAX_LABEL_CHARS]


def _m(name: str, type_: MetricType, unit: str, labels: tuple[str, ...], meaning: str, **kw: Any) -> Metric:
    return Metric(name, type_, unit, labels, meaning, **kw)


# --- the declarations (docs/operations.md is generated from these) ------------------------------

JOBS_INFLIGHT = _m(
    "recon_jobs_inflight", "observable_gauge", "{job}", ("kind", "provider", "age"),
    "Jobs in flight (`pending`/`processing`) by provider kind and age since their provider call "
    "(or creation): `lt_15m`, `15m_1h`, `1h_6h`, `6h_24h`, `ge_24h`.", source="database",
)  # fmt: skip
JOBS_STALE = _m(
    "recon_jobs_stale", "observable_gauge", "{job}", ("kind", "provider", "age"),
    "Of those, jobs past their kind's stale threshold: what reconciliation has to reach.",
    source="database",
)  # fmt: skip
CREDITS_LEAKED = _m(
    "recon_credit_leaked_jobs", "observable_gauge", "{job}", (),
    "Terminal jobs still holding reserved credits 10 minutes after they ended (the `no_credit_leak` "
    "check).", source="database",
)  # fmt: skip
PROVIDER_POLLED = _m(
    "recon_provider_polled_jobs", "observable_gauge", "{job}", ("provider",),
    f"Distinct jobs polled in the health window (`{Settings.health_window_s.name}`), each by its latest poll.",
    source="database",
)  # fmt: skip
PROVIDER_UNANSWERED = _m(
    "recon_provider_unanswered_jobs", "observable_gauge", "{job}", ("provider",),
    "Of those, jobs whose latest poll got no answer (5xx, 429, timeout, refused connection, "
    "rejected key).", source="database",
)  # fmt: skip
PROVIDER_DOWN = _m(
    "recon_provider_down", "observable_gauge", "{provider}", ("provider",),
    "1 while the provider's health verdict is DOWN (the `provider_health` check's rule: at least "
    f"`{Settings.health_min_jobs.name}` unanswered and more than `{Settings.health_down_share.name}` of its "
    "jobs), else 0.",
    source="database",
)  # fmt: skip
OUTCOMES = _m(
    "recon_reconcile_outcomes", "counter", "{job}", ("kind", "provider", "outcome"),
    "Jobs worked by reconciliation, by outcome: `recovered`, `failed`, `swept`, `exhausted`, "
    "`still_running`, `error`, `not_sent`, `lost_race`, `skipped`.",
)  # fmt: skip
FORCE_FAILS = _m(
    "recon_force_fails", "counter", "{job}", ("kind", "provider"),
    f"Jobs failed and refunded at the attempt cap (`{Settings.max_attempts.name}`), each also a `reconcile_exhausted` "
    "anomaly.",
)  # fmt: skip
CREDITS_COMMITTED = _m(
    "recon_credits_committed_jobs", "counter", "{job}", ("kind", "provider"),
    "Jobs whose reserved credits were committed (charged) by the completion path.",
)  # fmt: skip
CREDITS_COMMITTED_AMOUNT = _m(
    "recon_credits_committed", "counter", "{credit}", ("kind", "provider"),
    "Credits committed (the committed reservations' amounts).",
)  # fmt: skip
CREDITS_REFUNDED = _m(
    "recon_credits_refunded_jobs", "counter", "{job}", ("kind", "provider"),
    "Jobs whose reserved credits were refunded to their pools (failed, swept, force-failed).",
)  # fmt: skip
CREDITS_REFUNDED_AMOUNT = _m(
    "recon_credits_refunded", "counter", "{credit}", ("kind", "provider"),
    "Credits refunded (subscription and top-up pools together).",
)  # fmt: skip
POLLS_SENT = _m(
    "recon_polls_sent", "counter", "{poll}", ("kind", "provider"),
    "Polls that left this process (answered or not: each one is an attempt's evidence).",
)  # fmt: skip
POLLS_NOT_SENT = _m(
    "recon_polls_not_sent", "counter", "{poll}", ("kind", "provider", "reason"),
    "Polls this process never sent, by reason (`limiter_refused`, `token_wait`, `slot_wait`, "
    "`limiter_database_unreachable`): rescheduled, no attempt counted.",
)  # fmt: skip
LIMITER_WAIT = _m(
    "recon_limiter_wait", "histogram", "s", ("provider",),
    "Time a provider request's try waited for the limiters (the account's shared slot and rate token, "
    "the process's own) before it went out.",
)  # fmt: skip
RETRY_AFTER = _m(
    "recon_retry_after_blocks", "counter", "{answer}", ("provider",),
    "Provider answers carrying a Retry-After (429, 503, a soft envelope error): the account waits "
    "that long before its next request.",
)  # fmt: skip
PROVIDER_ANSWERS = _m(
    "recon_provider_answers", "counter", "{request}", ("provider", "class"),
    "Provider HTTP requests by how they ended: `2xx`, `3xx`, `4xx`, `404`, `429`, `5xx`, `timeout`, "
    "`connect` (refused, reset, name not resolved), `other`.",
)  # fmt: skip
ORPHAN_ACTIONS = _m(
    "recon_orphan_actions", "counter", "{task}", ("provider", "action"),
    "Upstream tasks no in-flight job owns, by what the orphan sweep did (`adopted`, `cancelled`, "
    "`reported`, `listed`, ...).",
)  # fmt: skip
SPEND_DIFFERENCE = _m(
    "recon_spend_difference", "gauge", "{unit}", ("provider", "unit"),
    "The latest difference between a provider's bill and what our jobs recorded (its own unit: "
    "`seconds`, `characters`, `tokens`, `credits`); 0 when they agree.",
)  # fmt: skip
ALERT_DELIVERIES = _m(
    "recon_alert_deliveries", "counter", "{delivery}", ("target", "action", "result"),
    "Alert deliveries of the `reconcile_alerts` sensor by target (`slack`, `pagerduty`, `teams`, "
    "`webhook`), action (`trigger`, `resolve`) and result (`delivered`, `failed`).",
)  # fmt: skip
SENSOR_TICK = _m(
    "recon_sensor_tick_duration", "histogram", "s", ("sensor",),
    "Wall time of one sensor evaluation (`stale_inflight_jobs_sensor`, `reconcile_alerts`).",
)  # fmt: skip

METRICS: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))

# The live instruments by name, set by ``install`` (empty: telemetry off, every call a no-op).
_INSTRUMENTS: dict[str, Any] = {}
_lock = threading.Lock()

Callback = Callable[[], Iterable[tuple[float, Mapping[str, str | None]]]]


def install(meter: Meter) -> None:
    """Create every synchronous instrument on ``meter`` (the SDK's, from ``setup``)."""
    with _lock:
        for m in METRICS:
            if m.type == "counter":
                _INSTRUMENTS[m.name] = meter.create_counter(m.name, unit=m.unit, description=m.meaning)
            elif m.type == "histogram":
                _INSTRUMENTS[m.name] = meter.create_histogram(
                    m.name,
                    unit=m.unit,
                    description=m.meaning,
                    explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
                )
            elif m.type == "gauge":
                _INSTRUMENTS[m.name] = meter.create_gauge(m.name, unit=m.unit, description=m.meaning)


def observe(meter: Meter, metric: Metric, callback: Callback) -> None:
    """Register an observable gauge whose values ``callback`` computes at each collection; a
    callback that raises reports nothing that time (the SDK logs it)."""

    def collect(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, metric.attributes(labels)) for value, labels in callback()]

    meter.create_observable_gauge(
        metric.name, callbacks=[collect], unit=metric.unit, description=metric.meaning
    )


def uninstall() -> None:
    """Telemetry off again (tests; ``setup.shutdown``)."""
    with _lock:
        _INSTRUMENTS.clear()


def enabled() -> bool:
    return bool(_INSTRUMENTS)


# --- money metrics count only what a transaction committed ---------------------------------------

_PENDING = "recon_telemetry_pending"


def add_on_commit(conn: Any, metric: Metric, value: float, **labels: str | None) -> None:
    """Add to ``metric`` when ``conn``'s transaction commits (dropped if it rolls back): a refund
    inside a transaction that fails later moved no credits. ``install_commit_hooks`` does the rest."""
    if metric.name in _INSTRUMENTS:
        conn.info.setdefault(_PENDING, []).append((metric, value, labels))


def _committed(conn: Any) -> None:
    for metric, value, labels in conn.info.pop(_PENDING, None) or ():
        metric.add(value, **labels)


def _rolled_back(conn: Any) -> None:
    # An invalidated connection (a lost server, or one closed on purpose as migrate's session is)
    # has no info to read: reading it tries to reconnect and raises inside SQLAlchemy's rollback,
    # hiding whatever happened. Its pending additions go with it (the pool clears a connection's
    # info before it connects again).
    if conn.invalidated:
        return
    conn.info.pop(_PENDING, None)


def install_commit_hooks() -> None:
    """Listen to every engine's commits and rollbacks (once per process)."""
    import sqlalchemy as sa

    if not sa.event.contains(sa.engine.Engine, "commit", _committed):
        sa.event.listen(sa.engine.Engine, "commit", _committed)
        sa.event.listen(sa.engine.Engine, "rollback", _rolled_back)
