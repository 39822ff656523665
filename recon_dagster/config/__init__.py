"""Every setting of recon_dagster, declared once: name, type, default, bounds, meaning.

The bottom layer: it imports nothing of recon_dagster outside this package (``parse``: the
parsers and their one-line errors; ``var``: ``Var``, one declaration; ``groups``: the declarations,
one module per group, joined here into ``Settings``; ``docs``: the generated page, readers found
in the code). This module is the machinery: joining, declaring the providers', reading, validating.
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
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from recon_dagster.config.groups.accounts import AccountGroup
from recon_dagster.config.groups.alerts import AlertGroup
from recon_dagster.config.groups.database import DatabaseGroup
from recon_dagster.config.groups.media import MediaGroup
from recon_dagster.config.groups.operators import OperatorGroup
from recon_dagster.config.groups.provider_io import ProviderIoGroup
from recon_dagster.config.groups.reconcile import ReconcileGroup
from recon_dagster.config.groups.retention import RetentionGroup
from recon_dagster.config.groups.telemetry import TelemetryGroup
from recon_dagster.config.parse import (
    FLAG_VALUES,
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    UNLIMITED,
    LimitsConfigError,
    authority,
    bounded_number,
    host_list,
    parse_limit_overrides,
)
from recon_dagster.config.var import DAY_S, PREFIX, Var, limit_setting, named, secret

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
    "DAY_S",
    "attributes",
    "limit_name",
    "limit_var",
    "markdown",
    "parse_allowed_hosts",
    "parse_limit_overrides",
    "settings",
    "validate",
]

T = TypeVar("T")


# The bases in the order of the docs (a group's section of the page follows its first declaration).
class Settings(
    DatabaseGroup,
    ReconcileGroup,
    ProviderIoGroup,
    MediaGroup,
    AccountGroup,
    AlertGroup,
    TelemetryGroup,
    RetentionGroup,
    OperatorGroup,
):
    """Every ``RECON_*`` setting as a typed attribute, read from the environment when asked.

    The attributes are declared by group in ``recon_dagster.config.groups`` (this class inherits
    them all), the providers' ``RECON_LIMIT_*`` by ``declare_provider``.

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
        """Whether ``var`` has a value (for optional ``dg.EnvVar`` wiring; never reads it out). A
        value of only whitespace is none: a key read from an empty secret file is not a key."""
        return bool(self._env().get(var.name, "").strip())

    def limit_overrides(self, provider: str) -> dict[str, Any]:
        """``RECON_LIMIT_<PROVIDER>``: the fields of ``provider``'s budget it overrides."""
        return self.value(limit_var(provider))


_GROUPS: tuple[type, ...] = Settings.__mro__[1:-1]  # the groups, without Settings itself and object


def attributes() -> dict[str, Var[Any]]:
    """Every attribute of ``Settings`` that is a declaration, by attribute name, in the order of the
    docs: the groups' (in ``_GROUPS`` order), then the providers' ``RECON_LIMIT_*``."""
    _declare_providers()
    return {
        attr: var
        for owner in (*_GROUPS, Settings)
        for attr, var in vars(owner).items()
        if isinstance(var, Var)
    }


_OTHERS: tuple[Var[Any], ...] = (
    named(
        "media", "text", None, "S3 access key id (unset: boto3's own credential chain).",
        readers="media/store.py", shown_default="boto3 chain", name="AWS_ACCESS_KEY_ID",
    ),
    secret(
        "media", "S3 secret key (unset: boto3's own credential chain).", readers="media/store.py",
        name="AWS_SECRET_ACCESS_KEY",
    ),
    named(
        "media", "text", None, "S3 region.", readers="media/store.py", shown_default="boto3 chain",
        name="AWS_REGION",
    ),
    # OpenTelemetry's own variables, read by its SDK (with RECON_TELEMETRY=1)
    named(
        "telemetry", "URL", None,
        "OTLP/HTTP collector base URL (`/v1/metrics` and `/v1/traces` appended); unset (and no "
        "`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` / `..._TRACES_ENDPOINT`): nothing is pushed.",
        readers="telemetry/sdk.py", shown_default="— (no push)", name="OTEL_EXPORTER_OTLP_ENDPOINT",
    ),
    secret(
        "telemetry", "Headers of every OTLP request (`key=value,...`, e.g. the collector's token).",
        readers="telemetry/sdk.py", name="OTEL_EXPORTER_OTLP_HEADERS",
    ),
    named(
        "telemetry", "text", "recon_dagster", "The `service.name` resource attribute of every metric and span.",
        readers="telemetry/sdk.py", name="OTEL_SERVICE_NAME",
    ),
    named(
        "telemetry", "milliseconds", 60000, "How often a long-lived process pushes its metrics by OTLP.",
        readers="telemetry/sdk.py", name="OTEL_METRIC_EXPORT_INTERVAL",
    ),
    # Dagster
    named(
        "dagster", "path", None, "Dagster instance folder; for deployments copy `dagster.yaml` there.",
        readers="operator/instance.py, cli", shown_default="`.recon/dagster_home` (demo, dev)",
        name="DAGSTER_HOME",
    ),
    named(
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
    if attr in vars(Settings):  # the providers' are Settings' own attributes
        return
    var = limit_setting(limits_shown, limits_doc)
    setattr(Settings, attr, var)
    var.__set_name__(Settings, attr)
    url = named(
        "providers", "URL", None, f"{title} API base URL{base_url_note}; passed as dg.EnvVar.",
        readers="providers/resource.py", shown_default=f"`{base_url}`", name=base_url_env,
    )  # fmt: skip
    # Every provider's key is optional: its secret concerns its own kinds only.
    not_configured = (
        f" Unset or blank: {title} is not configured (its kinds are left in flight, untouched, and "
        "every other provider works)."
    )
    key = secret("providers", key_doc + not_configured, readers="providers/resource.py", name=key_env)
    extras: list[Var[Any]] = [
        secret("providers", doc, readers=readers, name=env) for env, doc, readers in extra_secrets
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
    return (*attributes().values(), *_PROVIDER_VARS, *_OTHERS)


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
    s.name: s
    for s in (*(v for group in _GROUPS for v in vars(group).values() if isinstance(v, Var)), *_OTHERS)
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
