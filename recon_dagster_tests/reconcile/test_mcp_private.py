"""An MCP-origin job (its workflow execution carries an ``mcp_client``) is never made public by
reconciliation, whatever its ``is_public`` holds; other jobs keep the row's value, NULL meaning
public. Real PostgreSQL, real HTTP to the sandbox."""

from __future__ import annotations

import pytest

from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.finalize import MediaPolicy, ProviderResult, finalize_job_with_media
from recon_dagster_tests.support.factories import make_user, make_workflow
from recon_dagster_tests.support.reconcile import finished_kie_job, one


def _asset_public(db, sandbox, media_dir, *, is_public, mcp_client, in_workflow=True):
    """Finalize one finished job and return its asset's ``is_public``."""
    user = make_user(db)
    wf = make_workflow(db, user, status="running", mcp_client=mcp_client) if in_workflow else None
    job, task = finished_kie_job(
        db, sandbox, user, is_public=is_public, workflow_execution_id=wf, node_id="X" if wf else None
    )
    providers = providers_from_env()
    out = finalize_job_with_media(
        db,
        LocalMediaStore(base_dir=media_dir),
        job,
        ProviderResult.from_status(providers.poll("kie-standard", task)),
        source="reconcile",
        policy=MediaPolicy(headers_for=providers.media_headers),
    )
    assert out.ok and out.asset_created
    return one(db, "SELECT is_public FROM assets WHERE job_id = :j", j=job)


@pytest.mark.parametrize("is_public", [None, True, False])
@pytest.mark.parametrize("mcp_client", ["claude-desktop", "cursor", " "])
def test_an_mcp_origin_jobs_asset_is_never_public(db, sandbox, media_dir, is_public, mcp_client):
    assert _asset_public(db, sandbox, media_dir, is_public=is_public, mcp_client=mcp_client) is False


@pytest.mark.parametrize("mcp_client", [None, ""])
@pytest.mark.parametrize("in_workflow", [True, False])
@pytest.mark.parametrize(("is_public", "expected"), [(None, True), (True, True), (False, False)])
def test_a_non_mcp_job_keeps_its_is_public_and_null_means_public(
    db, sandbox, media_dir, mcp_client, in_workflow, is_public, expected
):
    got = _asset_public(
        db, sandbox, media_dir, is_public=is_public, mcp_client=mcp_client, in_workflow=in_workflow
    )
    assert got is expected
