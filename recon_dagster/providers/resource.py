"""One resource for all providers, dispatching on ``provider_kind``; and its wiring from env vars."""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

from recon_dagster import config
from recon_dagster.core.kinds import Provider, get_kind
from recon_dagster.core.redaction import register_secret
from recon_dagster.providers.anthropic import ANTHROPIC_BASE_URL, AnthropicResource
from recon_dagster.providers.base import (
    AsyncProviderResource,
    ProgressCallback,
    ProviderConfigError,
    ProviderResource,
    TaskCreatedCallback,
)
from recon_dagster.providers.elevenlabs import ELEVENLABS_BASE_URL, ElevenLabsResource
from recon_dagster.providers.kie import KIE_BASE_URL, KieResource
from recon_dagster.providers.limits import resource_limit_fields
from recon_dagster.providers.replicate import REPLICATE_BASE_URL, ReplicateResource
from recon_dagster.providers.status import MediaRef, UpstreamStatus

API_KEY_ENV_VARS = ("KIE_API_KEY", "REPLICATE_API_TOKEN", "ELEVENLABS_API_KEY", "ANTHROPIC_API_KEY")


class ProvidersResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
    """All four provider resources behind one ``provider_kind`` dispatch (what reconcile ops use)."""

    kie: KieResource
    replicate: ReplicateResource
    elevenlabs: ElevenLabsResource
    anthropic: AnthropicResource

    def for_kind(self, kind: str) -> ProviderResource:
        """The resource serving ``kind`` (raises ``UnknownProviderKind`` for an unknown kind)."""
        provider = get_kind(kind).provider
        return {
            Provider.KIE: self.kie,
            Provider.REPLICATE: self.replicate,
            Provider.ELEVENLABS: self.elevenlabs,
            Provider.ANTHROPIC: self.anthropic,
        }[provider]

    def _async(self, kind: str) -> AsyncProviderResource:
        resource = self.for_kind(kind)
        if not get_kind(kind).is_async or not isinstance(resource, AsyncProviderResource):
            raise ProviderConfigError(f"{kind} is synchronous: it has no task to create, poll or resume")
        return resource

    def create(self, kind: str, payload: dict[str, Any]) -> str:
        """Start a task of ``kind``; returns its task id."""
        return self._async(kind).create(kind, payload)

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        """One poll of ``task_id`` of ``kind``."""
        return self._async(kind).poll(kind, task_id)

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

    def close(self) -> None:
        """Close every provider's pooled client."""
        for resource in (self.kie, self.replicate, self.elevenlabs, self.anthropic):
            resource.close()


def _base_url(name: str, default: str) -> str:
    # An optional env var: an EnvVar only when set, since Dagster fails on an unset EnvVar.
    return dg.EnvVar(name) if config.is_set(name) else default


def providers_from_env() -> ProvidersResource:
    """The production wiring: keys from ``dg.EnvVar`` (never literals, so they stay out of run
    config and the UI), base URLs from ``*_BASE_URL`` when set, else the real providers.

    The keys present now are registered for masking at once, before any client is built."""
    for name in API_KEY_ENV_VARS:
        register_secret(os.environ.get(name))
    return ProvidersResource(
        kie=KieResource(
            base_url=_base_url("KIE_BASE_URL", KIE_BASE_URL),
            api_key=dg.EnvVar("KIE_API_KEY"),
            **resource_limit_fields("kie"),
        ),
        replicate=ReplicateResource(
            base_url=_base_url("REPLICATE_BASE_URL", REPLICATE_BASE_URL),
            api_key=dg.EnvVar("REPLICATE_API_TOKEN"),
            **resource_limit_fields("replicate"),
        ),
        elevenlabs=ElevenLabsResource(
            base_url=_base_url("ELEVENLABS_BASE_URL", ELEVENLABS_BASE_URL),
            api_key=dg.EnvVar("ELEVENLABS_API_KEY"),
            **resource_limit_fields("elevenlabs"),
        ),
        anthropic=AnthropicResource(
            base_url=_base_url("ANTHROPIC_BASE_URL", ANTHROPIC_BASE_URL),
            api_key=dg.EnvVar("ANTHROPIC_API_KEY"),
            **resource_limit_fields("anthropic"),
        ),
    )
