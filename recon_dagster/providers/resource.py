"""One resource for all providers, dispatching on ``provider_kind``; and its wiring from env vars.

Its fields are the registry's providers (``providers/registry.py``), one per provider, named after
it: the class is built from the registry, so adding a provider adds its field here.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import dagster as dg

from recon_dagster import config
from recon_dagster.core.kinds import ProviderSpec, get_kind, provider_spec, provider_specs
from recon_dagster.core.redaction import register_secret
from recon_dagster.providers.base import (
    AsyncProviderResource,
    ProgressCallback,
    ProviderConfigError,
    ProviderResource,
    TaskCreatedCallback,
)
from recon_dagster.providers.limits import resource_limit_fields
from recon_dagster.providers.status import MediaRef, NotSent, UpstreamStatus
from recon_dagster.providers.upstream_tasks import TaskListing
from recon_dagster.telemetry.instruments import POLLS_NOT_SENT, POLLS_SENT


def resource_class(spec: ProviderSpec) -> type[ProviderResource]:
    """The resource class a provider's spec names (``"module:Class"``)."""
    module, _, name = spec.resource.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, ProviderResource)):
        raise TypeError(f"{spec.name}: {spec.resource} is not a ProviderResource")
    return cls


def listing_providers() -> frozenset[str]:
    """The providers whose resource can list the account's tasks (``TaskListing``) and whose key is
    set here: the ones the orphan sweep looks at. Read from the registry, without building a client."""
    return frozenset(
        spec.name
        for spec in provider_specs()
        if issubclass(resource_class(spec), TaskListing) and config.is_set(spec.settings.key_env)
    )


def not_configured(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The providers whose key is unset or blank here, in the registry's order: not wired, their
    kinds not reconciled (no run is requested for them), every other provider unaffected."""
    return tuple(spec.name for spec in provider_specs() if not config.is_set(spec.settings.key_env, environ))


def not_configured_line(name: str) -> str:
    """The one line health, ``status``, the plan, the sensor and a run say of a provider without
    its key."""
    spec = provider_spec(name)
    kinds = ", ".join(k.name for k in spec.kinds)
    key = spec.settings.key_env
    return (
        f"{name}: not configured ({key} is not set); its kinds ({kinds}) stay in flight with no "
        f"attempt counted; set {key} for the code server, daemon and run workers"
    )


def api_key_env_vars() -> tuple[str, ...]:
    """Every provider's key variable (registered for masking before any client is built)."""
    return tuple(spec.settings.key_env for spec in provider_specs())


class ProvidersBase(dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
    """Every provider's resource behind one ``provider_kind`` dispatch (what reconcile ops use).

    One optional field per registered provider, named after it (``providers.kie``...): a provider
    left unset answers its kinds with a ``ProviderConfigError`` naming it.
    """

    def provider(self, name: str) -> ProviderResource:
        """The resource of the provider called ``name``."""
        resource = getattr(self, name, None)
        if not isinstance(resource, ProviderResource):
            raise ProviderConfigError(not_configured_line(name))
        return resource

    def configured(self) -> tuple[ProviderResource, ...]:
        """The provider resources that are set, in the registry's order."""
        found = (getattr(self, spec.name, None) for spec in provider_specs())
        return tuple(r for r in found if isinstance(r, ProviderResource))

    def for_kind(self, kind: str) -> ProviderResource:
        """The resource serving ``kind`` (raises ``UnknownProviderKind`` for an unknown kind)."""
        return self.provider(get_kind(kind).provider)

    def _async(self, kind: str) -> AsyncProviderResource:
        resource = self.for_kind(kind)
        if not get_kind(kind).is_async or not isinstance(resource, AsyncProviderResource):
            raise ProviderConfigError(f"{kind} is synchronous: it has no task to create, poll or resume")
        return resource

    def create(self, kind: str, payload: dict[str, Any]) -> str:
        """Start a task of ``kind``; returns its task id."""
        return self._async(kind).create(kind, payload)

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        """One poll of ``task_id`` of ``kind``, counted as sent or not sent (with its reason)."""
        try:
            status = self._async(kind).poll(kind, task_id)
        except NotSent as exc:
            POLLS_NOT_SENT.add(1, kind=kind, reason=exc.reason.value)
            raise
        except Exception:
            POLLS_SENT.add(1, kind=kind)  # it left: whatever came back is the attempt's evidence
            raise
        POLLS_SENT.add(1, kind=kind)
        return status

    def run(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        on_task_created: TaskCreatedCallback | None = None,
        on_progress: ProgressCallback | None = None,
        poll_interval_s: float | None = None,
        budget_s: float | None = None,
    ) -> UpstreamStatus:
        """Create, report the task id, poll until terminal (see ``AsyncProviderResource.run``)."""
        return self._async(kind).run(
            kind, payload, on_task_created=on_task_created, on_progress=on_progress,
            poll_interval_s=poll_interval_s, budget_s=budget_s,
        )  # fmt: skip

    def resume(
        self,
        kind: str,
        task_id: str,
        *,
        on_progress: ProgressCallback | None = None,
        poll_interval_s: float | None = None,
        budget_s: float | None = None,
    ) -> UpstreamStatus:
        """Poll an existing task until terminal; never creates one."""
        return self._async(kind).resume(
            kind, task_id, on_progress=on_progress, poll_interval_s=poll_interval_s, budget_s=budget_s
        )

    def media_headers(self, kind: str, ref: MediaRef) -> dict[str, str]:
        """Headers needed to fetch ``ref`` of ``kind`` (the key only for the provider's own host)."""
        return self.for_kind(kind).media_headers(ref)

    def media_slot(self, kind: str, ref: MediaRef) -> AbstractContextManager[None]:
        """What the download of ``ref`` of ``kind`` holds while it lasts (``media_slot`` of its provider)."""
        return self.for_kind(kind).media_slot(ref)

    def close(self) -> None:
        """Close every provider's pooled client."""
        for resource in self.configured():
            resource.close()


def _build_providers_resource() -> type[ProvidersBase]:
    fields = {spec.name: resource_class(spec) | None for spec in provider_specs()}
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": "ProvidersResource",
        "__doc__": ProvidersBase.__doc__,
        "__annotations__": fields,
        **dict.fromkeys(fields),
    }
    return type("ProvidersResource", (ProvidersBase,), namespace)


if TYPE_CHECKING:

    class ProvidersResource(ProvidersBase):
        """Built from the registry at import (one field per provider)."""

else:
    ProvidersResource = _build_providers_resource()


def _base_url(name: str, default: str) -> str:
    # An optional env var: an EnvVar only when set, since Dagster fails on an unset EnvVar.
    return dg.EnvVar(name) if config.is_set(name) else default


def providers_from_env() -> ProvidersResource:
    """The production wiring: keys from ``dg.EnvVar`` (never literals, so they stay out of run
    config and the UI), base URLs from ``*_BASE_URL`` when set, else the real providers. A provider
    is wired only when its key is set (not blank): one missing key never fails the resource, and so
    every run, at initialisation; that provider's kinds answer a one-line ``ProviderConfigError``.

    The keys present now are registered for masking at once, before any client is built."""
    for name in api_key_env_vars():
        register_secret(os.environ.get(name))
    return ProvidersResource(
        **{
            spec.name: resource_class(spec)(
                base_url=_base_url(spec.settings.base_url_env, spec.settings.base_url),
                api_key=dg.EnvVar(spec.settings.key_env),
                **resource_limit_fields(spec.name),
            )
            for spec in provider_specs()
            if config.is_set(spec.settings.key_env)
        }
    )
