"""The media host: task outputs as an object store serves them (S3-shaped errors, no key)."""

from __future__ import annotations

import re

from recon_dagster.sandbox.core import SandboxCore
from recon_dagster.sandbox.media import MEDIA_TYPES
from recon_dagster.sandbox.refusals import media_error
from recon_dagster.sandbox.scenario import media_kind_for
from recon_dagster.sandbox.wire import Request, Response

_RE_MEDIA = re.compile(r"^/media/(?P<id>[^/]+)/(?:(?P<cover>cover-)?(?P<n>\d+))\.(?P<ext>[a-z0-9]+)$")


def serve(sb: SandboxCore, req: Request) -> Response:
    match = _RE_MEDIA.match(req.path)
    if match is None or req.method not in ("GET", "HEAD"):
        return media_error(404)
    task = sb.state.get(match["id"])
    if task is None:
        return media_error(404)
    if req.method == "GET":
        sb.state.count_media(task.task_id)
    sc = task.scenario
    n = int(match["n"])
    kind = "image" if match["cover"] else media_kind_for(task.family, sc)
    if n >= len(sb.links(task).media) or MEDIA_TYPES[kind][0] != match["ext"]:
        return media_error(404)
    # Failed tasks have no media; Replicate deletes outputs; Runway links expire.
    if sc.outcome != "succeed" or sc.data_removed:
        return media_error(404)
    if sc.expired:
        return media_error(403)
    if sc.media_status != 200:
        return media_error(sc.media_status)
    return sb.stream(task.task_id, n, kind, sc, req.method)
