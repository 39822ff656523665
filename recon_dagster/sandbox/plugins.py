"""Sandboxes that providers bring in their own packages (``ProviderSpec.sandbox``).

A provider package may ship its sandbox half (``providers/<name>/sandbox.py``): its routes under
``/<name>/``, how it reads the key, its error shape, and per endpoint family the media it produces,
its documented failure values, its running values and its poll body. The sandbox loads every
registered spec's plugin by name (the sandbox never imports a provider package statically); the
shared machinery (the routing table, auth, refusals, scenarios and poll bodies) asks it here.
The bottom of the sandbox beside ``wire`` and ``media``: it imports no other sandbox module (the
names below ``TYPE_CHECKING`` are types only), so every other module may use it.
"""

from __future__ import annotations

import importlib
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recon_dagster.core.kinds import provider_specs

if TYPE_CHECKING:
    from recon_dagster.sandbox.core import Route
    from recon_dagster.sandbox.refusals import ErrorShape, Refusals
    from recon_dagster.sandbox.shapes import Links
    from recon_dagster.sandbox.state import Task
    from recon_dagster.sandbox.wire import Request, Response


def _hex_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class PluginFamily:
    """One endpoint family of a plugin provider, as the sandbox's shared tables need it. A sync
    family (no task to poll) sets only ``media_kind``."""

    media_kind: str  # what a task produces unless its scenario says otherwise
    fail_states: tuple[str, ...] = ()  # documented failure values (the first is the default)
    running_values: tuple[Any, ...] = ()  # the state values of a running task, in order
    state_path: tuple[str, ...] = ()  # where the state lives in a poll body (for malformed bodies)
    render: Callable[[Task, str, int, Links], dict[str, Any]] | None = None  # a poll body in a phase
    new_task_id: Callable[[], str] = _hex_id
    # One media object per task whatever the scenario's media_count (an edit, a video, weights).
    single_media: bool = False
    # Where a client fetches a task's media, given the sandbox's base URL (None: the media host).
    media_urls: Callable[[Task, str], list[str]] | None = None


@dataclass(frozen=True)
class SandboxPlugin:
    """A provider's sandbox, served under ``/<provider>/``: its routes, how a request presents the
    key, its refusals (one ``error`` shape, or ``refusals`` when each refusal has its own documented
    body) and its endpoint families."""

    provider: str
    routes: tuple[Route, ...]
    # Environment for the project's clients, given the provider's sandbox base URL and the key.
    env: Callable[[str, str], dict[str, str]]
    # The key a request presents (None: none), compared with the sandbox's key.
    presented_key: Callable[[Request], str | None] | None = None
    # A refusal in the provider's error shape: (status, error type, message, extra headers, delay).
    error: Callable[[int, str, str, Mapping[str, str], float], Response] | None = None
    families: Mapping[str, PluginFamily] = field(default_factory=dict)
    # Every refusal in the provider's own shapes (None: each one built from ``error``).
    refusals: Refusals | None = None
    # The header a key-echoing gateway reads the key from (``Authorization``: after its scheme).
    key_header: str = "Authorization"
    # The API's root under ``/<provider>`` (e.g. ``/v1``), for the clients' base URL.
    base_path: str = ""
    # Scenario fields only this provider reads, by the provider's JSON name -> ``Scenario`` attribute.
    scenario_fields: Mapping[str, str] = field(default_factory=dict)


def error_shape(provider: str) -> ErrorShape | None:
    """A provider's one error shape (None when it has documented refusals instead)."""
    return plugins()[provider].error


_lock = threading.Lock()
_loaded: dict[str, SandboxPlugin] | None = None


def plugins() -> dict[str, SandboxPlugin]:
    """Every registered provider's sandbox plugin by provider name (loaded and plugged in once)."""
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                found: dict[str, SandboxPlugin] = {}
                for spec in provider_specs():
                    if spec.sandbox is not None:
                        module, _, attribute = spec.sandbox.partition(":")
                        plugin = getattr(importlib.import_module(module), attribute)
                        if not isinstance(plugin, SandboxPlugin) or plugin.provider != spec.name:
                            raise TypeError(f"{spec.sandbox} is not {spec.name}'s SandboxPlugin")
                        found[spec.name] = plugin
                _loaded = found
    return _loaded


def family(name: str) -> PluginFamily | None:
    """A plugin provider's endpoint family (None: a built-in family)."""
    for plugin in plugins().values():
        if name in plugin.families:
            return plugin.families[name]
    return None


def family_of(name: str) -> PluginFamily:
    """The endpoint family ``name`` (a ``KeyError`` naming it when no plugin brings it)."""
    found = family(name)
    if found is None:
        raise KeyError(name)
    return found


def scenario_fields() -> dict[str, str]:
    """The scenario fields a provider alone reads, by its JSON name -> ``Scenario`` attribute."""
    return {name: attr for plugin in plugins().values() for name, attr in plugin.scenario_fields.items()}
