"""Poll answers as the providers send them, in short: KIE's envelope, a Replicate prediction, the
states a parser returns, and a media URL."""

from __future__ import annotations

from typing import Any

from recon_dagster.providers.status import UpstreamState

R, S, F, E, NF = (
    UpstreamState.RUNNING,
    UpstreamState.SUCCEEDED,
    UpstreamState.FAILED,
    UpstreamState.EXPIRED,
    UpstreamState.NOT_FOUND,
)
IMG = "https://tempfile.aiquickdraw.com/r/abc.png"


def kie(data: Any, code: int = 200, msg: str = "success") -> dict[str, Any]:
    """KIE's envelope around ``data``."""
    return {"code": code, "msg": msg, "data": data}


def pred(status: str, **extra: Any) -> dict[str, Any]:
    """A Replicate prediction in ``status``."""
    return {
        "id": "p1",
        "status": status,
        "urls": {"get": "https://api.replicate.com/v1/predictions/p1"},
        **extra,
    }
