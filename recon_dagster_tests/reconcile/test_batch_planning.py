"""``plan_batches``: the pure planning of a tick's due rows into runs (no database)."""

from __future__ import annotations

from recon_dagster.core.kinds import KINDS
from recon_dagster.core.types import JobRow
from recon_dagster.reconcile.batches import plan_batches
from recon_dagster_tests.support.factories import unsaved_job_row as row


def _rows(kind: str, n: int) -> list[JobRow]:
    return [row(kind, f"t-{i}") for i in range(n)]


def _sizes(batches, kind: str) -> list[int]:
    return [len(b.claims) for b in batches if b.provider_kind == kind]


def test_each_provider_packs_to_its_own_batch_size() -> None:
    """A binding budget on one account shrinks only that provider's runs; every row is planned once."""
    rows = _rows("kie-lip-sync", 25) + _rows("replicate-prediction", 25) + _rows("elevenlabs-async", 7)
    assert str(KINDS["kie-lip-sync"].provider) == "kie"
    batches = plan_batches(
        rows, batch_size=20, single_below=3, provider_batch_size={"kie": 4, "replicate": 30}
    )
    assert _sizes(batches, "kie-lip-sync") == [4, 4, 4, 4, 4, 4, 1]
    assert _sizes(batches, "replicate-prediction") == [25]
    assert _sizes(batches, "elevenlabs-async") == [7]  # no size of its own: batch_size
    planned = [c.job_id for b in batches for c in b.claims]
    assert sorted(planned) == sorted(r.id for r in rows)


def test_without_provider_sizes_every_kind_packs_to_batch_size() -> None:
    batches = plan_batches(_rows("kie-veo", 5) + _rows("kie-standard", 2), batch_size=2, single_below=3)
    assert _sizes(batches, "kie-veo") == [2, 2, 1]
    assert _sizes(batches, "kie-standard") == [1, 1]  # fewer than single_below: one run per job
