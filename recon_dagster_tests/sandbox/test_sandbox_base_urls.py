"""A provider's API root on the sandbox is a typed method (issue 49): ``server.<provider>_base_url``
came through ``__getattr__``, so mypy passed any name and a typo failed only when run."""

from __future__ import annotations

import pytest

from recon_dagster.sandbox import SandboxServer
from recon_dagster.sandbox.plugins import plugins


def test_no_attribute_is_made_up_at_run_time() -> None:
    assert "__getattr__" not in vars(SandboxServer)
    with SandboxServer() as sb, pytest.raises(AttributeError):
        sb.kie_base_url  # type: ignore[attr-defined]  # noqa: B018


def test_every_registered_provider_has_its_api_root() -> None:
    with SandboxServer() as sb:
        for name, plugin in plugins().items():
            assert sb.api_base_url(name) == f"{sb.base_url}/{name}{plugin.base_path}"
        with pytest.raises(KeyError, match="not a registered provider"):
            sb.api_base_url("nope")
