"""KIE's record of what it billed: only the account's credit balance (``GET /api/v1/chat/credit``,
``{"code": 200, "msg": "success", "data": <credits>}``). KIE has no per-task billing API, so the
spend reconciliation samples the balance and compares its change with the credits our KIE jobs
recorded. Read through the resource's own client (its limits, deadline, envelope retries)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recon_dagster.providers.http import json_body
from recon_dagster.providers.status import ProviderHTTPError, ProviderProtocolError

if TYPE_CHECKING:
    from recon_dagster.providers.http import ProviderHttp

LABEL = "kie-credit"
CREDIT_PATH = "/api/v1/chat/credit"


class KieSpend:
    """Mixed into ``KieResource``: the account's remaining credits."""

    if TYPE_CHECKING:
        http: ProviderHttp

    def credit_balance(self) -> float:
        """The account's remaining credits now."""
        response = self.http.request("GET", CREDIT_PATH, label=LABEL, idempotent=True)
        body = json_body(LABEL, response)
        if not isinstance(body, dict):
            raise ProviderProtocolError(LABEL, f"answer must be an object, got {body!r:.120}")
        code, data = body.get("code"), body.get("data")
        if code != 200:
            raise ProviderHTTPError(
                LABEL, code if isinstance(code, int) else None, str(body.get("msg") or "KIE error")
            )
        if isinstance(data, bool) or not isinstance(data, int | float) or data != data:
            raise ProviderProtocolError(LABEL, f"answer's data is not a number of credits: {body!r:.120}")
        return float(data)
