"""fal model ids, app ids and our task ids (plain functions: the client and the sandbox share them).

A fal model id is ``{owner}/{app}`` plus an optional endpoint path (``fal-ai/flux/dev``), with a
namespace in front for some apps (``workflows/...``, ``comfy/...``). Status, result and cancel use
only the app (``{owner}/{app}``, namespace included), as fal's queue reference says.
"""

from __future__ import annotations

# Apps whose id has a namespace segment before the owner.
APP_NAMESPACES = ("workflows", "comfy")


def app_of(model: str) -> str:
    """``{owner}/{app}`` of a model id (its namespace kept), without the endpoint path."""
    if not isinstance(model, str) or not model.strip("/") or model != model.strip("/") or "//" in model:
        raise ValueError(f"fal: model must be 'owner/app[/path]', got {model!r}")
    parts = model.split("/")
    size = 3 if parts[0] in APP_NAMESPACES else 2
    if len(parts) < size:
        raise ValueError(f"fal: model must be 'owner/app[/path]', got {model!r}")
    return "/".join(parts[:size])


def task_id_for(app: str, request_id: str) -> str:
    """Our task id of a fal request: the app (``/`` spelled ``:``) and the request id."""
    return f"{app.replace('/', ':')}:{request_id}"


def split_task_id(kind: str, task_id: str) -> tuple[str, str]:
    """``(app, request_id)`` of one of our fal task ids; ``ValueError`` naming the kind otherwise."""
    app, _, request_id = task_id.rpartition(":")
    parts = app.split(":")
    if (
        not request_id
        or len(parts) not in (2, 3)
        or not all(parts)
        or (len(parts) == 3) != (parts[0] in APP_NAMESPACES)
    ):
        raise ValueError(f"{kind}: task id must be '<owner>:<app>:<request_id>', got {task_id!r}")
    return "/".join(parts), request_id
