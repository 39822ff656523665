"""Every reason a request was not sent is one the code gives, and the operators' table lists each
(issue 49: ``breaker_open`` was documented and declared, but nothing ever raised it)."""

from __future__ import annotations

import re
from pathlib import Path

from recon_dagster.providers.status import NotSentReason

ROOT = Path(__file__).resolve().parents[2]


def test_every_not_sent_reason_is_given_somewhere() -> None:
    declared_in = ROOT / "recon_dagster/providers/status.py"
    code = "\n".join(
        p.read_text() for p in sorted((ROOT / "recon_dagster").rglob("*.py")) if p != declared_in
    )
    never = [reason.value for reason in NotSentReason if f"NotSentReason.{reason.name}" not in code]
    assert not never, f"declared but never given: {never}"


def test_the_operations_table_lists_exactly_the_reasons() -> None:
    text = (ROOT / "docs/operations.md").read_text()
    table = text[text.index("| reason | what held the poll back |") :].split("\n\n", 1)[0]
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M))
    assert listed == {reason.value for reason in NotSentReason}
