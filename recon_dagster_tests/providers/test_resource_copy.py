"""``model_copy(update=...)`` of a provider resource talks as the copy says (issue 49): the copy
kept the HTTP client its original had built, with the original's base URL, key and limits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from recon_dagster.core.kinds import provider_specs
from recon_dagster.providers.resource import resource_class
from recon_dagster.providers.status import ProviderHTTPError, UpstreamState
from recon_dagster.sandbox import SandboxServer, Scenario

KEY = "sandbox-key"
WRONG_KEY = "sk-wrong-0123456789abcdef"
FAST = {"backoff_initial_s": 0.01, "backoff_max_s": 0.05, "create_rate_per_s": None, "read_rate_per_s": None}


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as sb:
        yield sb


@pytest.mark.parametrize("spec", [s for s in provider_specs() if s.polled], ids=lambda s: s.name)
def test_a_copy_with_another_key_sends_that_key(server: SandboxServer, spec) -> None:
    kind = next(k.name for k in spec.kinds if k.is_async)
    task_id = server.add_task(kind, Scenario(polls_before_done=0))
    original = resource_class(spec)(base_url=server.env()[spec.settings.base_url_env], api_key=KEY, **FAST)
    assert original.poll(kind, task_id).state is UpstreamState.SUCCEEDED  # its client is built now

    copy = original.model_copy(update={"api_key": WRONG_KEY})
    with pytest.raises(ProviderHTTPError) as refused:
        copy.poll(kind, task_id)
    assert refused.value.status_code in (401, 403)
    # The original still talks with its own key and client.
    assert original.poll(kind, task_id).state is UpstreamState.SUCCEEDED
    # A copy that changes nothing may share the client: same URL, key and limits.
    assert original.model_copy().http is original.http
