"""``Var``, one declared environment variable, and the shorthands the groups declare theirs with.

The bottom of ``recon_dagster.config``: it imports only the parsers (``parse``). The groups
(``recon_dagster.config.groups``) declare the settings with it; the package joins them into
``Settings`` and reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Never, TypeVar, overload

from recon_dagster.config.parse import (
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    knob,
    parse_limit_overrides,
    shown_number,
)

if TYPE_CHECKING:
    from recon_dagster.config import Settings

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
WEEK_S = 7 * DAY_S


setting = Var  # a declaration with a parser, as the groups' tables spell it


def named(group: str, type_: str, default: Any, doc: str, **more: Any) -> Var[Never]:
    """Declared, documented, never read here: a library reads it (boto3, Dagster) or the module
    that uses it (``core.crashpoints``), through its name."""
    return Var(group, type_, default, doc, **more)


def _bounded(cast: type, default: float, low: float, high: float, doc: str, group: str) -> Var[Any]:
    kind = "whole number" if cast is int else "number"
    bounds = f"{shown_number(low)}-{shown_number(high)}"
    return Var(group, kind, cast(default), doc, parse=knob(cast, low, high), bounds=bounds)


def whole(default: int, low: int, high: int, doc: str, group: str = "reconcile") -> Var[int]:
    """A whole number within ``[low, high]``."""
    return _bounded(int, default, low, high, doc, group)


def number(default: float, low: float, high: float, doc: str, group: str = "reconcile") -> Var[float]:
    """A finite number within ``[low, high]``."""
    return _bounded(float, default, low, high, doc, group)


_LIMIT_BOUNDS = (
    f"reads/creates N/SECONDS: N 1-{MAX_REQUESTS}, SECONDS {MIN_WINDOW_S:g}-{MAX_WINDOW_S:g}, or none; "
    f"concurrency 1-{MAX_CONCURRENCY} or none; kind_share (0, 1]; `none` (or `off`) is the only unlimited: "
    "0, nan, inf are errors"
)


def limit_setting(shown: str, doc: str) -> Var[dict[str, Any]]:
    """``RECON_LIMIT_<PROVIDER>``: a provider account's budget overrides."""
    return Var(
        "provider budgets", "budget spec", {}, doc, parse=parse_limit_overrides, shown_default=shown,
        bounds=_LIMIT_BOUNDS,
    )  # fmt: skip


def secret(group: str, doc: str, *, name: str = "", readers: str = "") -> Var[Never]:
    return Var(group, "secret", None, doc, secret=True, name=name, readers=readers)  # type: ignore[arg-type]


POSITIVE = "> 0, finite"
