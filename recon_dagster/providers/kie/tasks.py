"""KIE's part of the orphan sweep: its create marker (KIE has no list endpoint: the create ledger
is the only record of what we started there)."""

from __future__ import annotations

from typing import Any

from recon_dagster.providers.create_marker import mark_url_field


class KieTasks:
    """Mixed into ``KieResource``: the job marker rides on the create's ``callBackUrl``."""

    def mark_request(self, kind: str, payload: dict[str, Any], marker: str) -> dict[str, Any] | None:
        return mark_url_field(payload, "callBackUrl", marker) if isinstance(payload, dict) else None
