"""Replicate's poll answers: predictions and trainings (``status``, ``output``, ``data_removed``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from recon_dagster.providers.parse import (
    EXPIRED,
    FAILED,
    RUNNING,
    SUCCEEDED,
    Body,
    looks_like_url,
    one_of,
    refs,
    show,
    status_of,
    task_id_of,
    text_of,
)
from recon_dagster.providers.replicate.spec import ReplicateFamily
from recon_dagster.providers.status import MediaRef, UpstreamStatus

_REPLICATE_RUNNING = frozenset({"starting", "processing"})
_REPLICATE_FAILED = frozenset({"failed", "canceled", "aborted"})


def _predict_time(body: Mapping[str, Any]) -> float | None:
    metrics = body.get("metrics")
    value = metrics.get("predict_time") if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def parse_replicate(b: Body, family: str, body: dict[str, Any], task_id: str | None) -> UpstreamStatus:
    status = body.get("status")
    tid = task_id_of(body.get("id"), task_id)
    metrics = {"predict_time_s": _predict_time(body)}
    if one_of(status, _REPLICATE_RUNNING):
        waiting = " (waiting for a machine)" if status == "starting" else ""
        return status_of(b.kind, body, RUNNING, tid, stage=f"{status} at replicate{waiting}")
    if one_of(status, _REPLICATE_FAILED):
        return status_of(
            b.kind,
            body,
            FAILED,
            tid,
            error=f"{status}: {text_of(body.get('error')) or 'no error message'}",
            **metrics,
        )
    if status != "succeeded":
        raise b.unknown_state("status", status)
    removed = body.get("data_removed", False)
    if not isinstance(removed, bool) and removed is not None:
        raise b.fail(f"data_removed must be a boolean, got {show(removed)}")
    output = body.get("output")
    # Replicate deletes API outputs an hour after completion: output becomes null, data_removed true.
    # Only data_removed proves that; a null output without it proves nothing (count the attempt).
    if removed:
        return status_of(
            b.kind, body, EXPIRED, tid, error="replicate output removed (data_removed)", **metrics
        )
    if output is None:
        raise b.fail("succeeded with output null but data_removed not true: neither a result nor expired")
    if family == ReplicateFamily.TRAINING:
        if not isinstance(output, dict):
            raise b.fail(f"training output must be an object with weights, got {show(output)}")
        weights = b.url(output.get("weights"), "output.weights")
        extra = {k: v for k, v in output.items() if k != "weights"}
        return status_of(
            b.kind, body, SUCCEEDED, tid, media=(MediaRef(url=weights, kind="weights"),),
            result=extra or None, progress=100, **metrics,
        )  # fmt: skip
    if isinstance(output, str) and looks_like_url(output):
        return status_of(b.kind, body, SUCCEEDED, tid, media=refs([output]), progress=100, **metrics)
    if isinstance(output, list) and output and all(looks_like_url(u) for u in output):
        return status_of(b.kind, body, SUCCEEDED, tid, media=refs(output), progress=100, **metrics)
    _check_text_output(b, output)
    # Text and structured models (token lists, objects): the output itself is the result. Whether
    # the job wanted media instead is the finalizer's question (it knows the job).
    return status_of(b.kind, body, SUCCEEDED, tid, result={"output": output}, progress=100, **metrics)


def _check_text_output(b: Body, output: object) -> None:
    """A Replicate output that is not media must still be a result: not empty, not half media."""
    if output in ("", [], {}) or (isinstance(output, str) and not output.strip()):
        raise b.fail(f"succeeded with an empty output {show(output)}: nothing to deliver")
    if isinstance(output, list):
        if any(looks_like_url(u) for u in output):
            # Some media and something else: the media is promised but the answer is malformed.
            raise b.fail(f"output mixes URLs with other values: {show(output)}")
        if not all(isinstance(u, str) for u in output) or not "".join(output).strip():
            raise b.fail(f"output list must hold text tokens or URLs, got {show(output)}")
