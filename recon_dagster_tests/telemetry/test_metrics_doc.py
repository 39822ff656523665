"""Every metric is declared once in ``recon_dagster.telemetry.instruments`` with bounded labels,
and ``docs/operations.md`` lists them from those declarations (``make docs``), as
``docs/configuration.md`` lists the settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from recon_dagster.core.kinds import KINDS, provider_names
from recon_dagster.telemetry import docs
from recon_dagster.telemetry.instruments import MAX_LABEL_CHARS, METRICS, OTHER, age_bucket

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations.md"
# Every label any metric may have: each takes few values (a registry's, an enum's, a bucket's).
BOUNDED_LABELS = {
    "kind",
    "provider",
    "outcome",
    "reason",
    "class",
    "action",
    "age",
    "target",
    "sensor",
    "unit",
    "result",
}


def test_the_committed_metrics_table_is_the_generated_one() -> None:
    page = PAGE.read_text()
    assert docs.with_table(page) == page, "docs/operations.md's metrics table is stale: run `make docs`"
    for m in METRICS:
        assert f"| `{m.prometheus_name}` |" in page


def test_the_generator_rewrites_only_its_block(tmp_path: Path) -> None:
    page = tmp_path / "ops.md"
    page.write_text(f"before\n{docs.BEGIN}\nold table\n{docs.END}\nafter\n")
    assert (
        subprocess.run(
            [sys.executable, "-m", "recon_dagster.telemetry.docs", str(page)], check=False
        ).returncode
        == 0
    )
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old table" not in text
    assert docs.metrics_markdown() in text


def test_every_metric_is_declared_once_with_a_unit_a_meaning_and_bounded_labels() -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert len({m.prometheus_name for m in METRICS}) == len(METRICS)
    for m in METRICS:
        assert m.name.startswith("recon_") and m.unit and m.meaning
        assert set(m.labels) <= BOUNDED_LABELS, m


@given(
    kind=st.one_of(st.sampled_from(sorted(KINDS)), st.text(max_size=80)),
    extra=st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=80), max_size=4),
)
def test_a_label_value_is_bounded_whatever_a_caller_passes(kind: str, extra: dict[str, str]) -> None:
    for m in METRICS:
        attrs = m.attributes({**extra, "kind": kind})
        assert set(attrs) == set(m.labels)  # undeclared labels (a job id) never pass
        if "kind" in attrs:
            assert attrs["kind"] in set(KINDS) | {OTHER, "none"}  # none: a job with no kind
        if "provider" in attrs:
            assert attrs["provider"] in set(provider_names()) | {OTHER, "none"}
        assert all(len(v) <= MAX_LABEL_CHARS for v in attrs.values())


@given(st.floats(min_value=0, max_value=10 * 86400))
def test_every_age_has_one_bucket_in_order(age: float) -> None:
    from recon_dagster.telemetry.instruments import AGE_BUCKETS

    label = age_bucket(age)
    i = [name for _, name in AGE_BUCKETS].index(label)
    assert AGE_BUCKETS[i][0] <= age
    assert i == len(AGE_BUCKETS) - 1 or age < AGE_BUCKETS[i + 1][0]
