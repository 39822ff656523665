"""A loopback HTTP server serving exactly the bodies and headers a test registers, and a stale job
whose provider answers success with a URL on it, reconciled once through the real Reconciler."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import parse_poll_response
from recon_dagster.providers.status import MediaRef, UpstreamStatus
from recon_dagster.reconcile.finalize import (
    MediaPolicy,
)
from recon_dagster.reconcile.reconciler import JobOutcome, Reconciler, ReconcileSettings
from recon_dagster_tests.support.answers import lease, stale_job
from recon_dagster_tests.support.factories import job_row
from recon_dagster_tests.support.poll_bodies import kie

# Kinds whose success names one URL rather than a list.
_ONE_URL = frozenset({"kie-runway", "kie-kontext"})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path.split("?", 1)[0])  # type: ignore[attr-defined]
        if route is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body, headers, chunked = route
        self.server.served.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        for name, value in headers.items():
            self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            if not chunked:
                self.wfile.write(body)
                return
            for start in range(0, len(body), 64 * 1024):
                piece = body[start : start + 64 * 1024]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class ServedMedia:
    """``add(body, content_type, ...)`` returns a URL answering 200 with exactly that body."""

    def __init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.routes = {}  # type: ignore[attr-defined]
        self.httpd.served = []  # type: ignore[attr-defined]
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def add(
        self,
        body: bytes,
        content_type: str | None,
        *,
        name: str = "",
        headers: dict[str, str] | None = None,
        chunked: bool = False,
    ) -> str:
        path = f"/m/{uuid.uuid4().hex}/{name or 'object'}"
        all_headers = {"Content-Type": content_type} if content_type else {}
        all_headers.update(headers or {})
        self.httpd.routes[path] = (body, all_headers, chunked)  # type: ignore[attr-defined]
        return f"http://{self.host}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module", name="served")
def served_fixture() -> Iterator[ServedMedia]:
    server = ServedMedia()
    yield server
    server.close()


def reconcile_served(
    db: sa.Engine,
    served: ServedMedia,
    media_dir: str,
    kind: str,
    job_type: str,
    url: str,
    *,
    should_watermark: bool | None = False,
    attempts: int = 0,
) -> tuple[uuid.UUID, uuid.UUID, JobOutcome]:
    """(user, job, outcome): a stale ``kind`` job whose poll answers success with ``url`` as its
    one media object, reconciled once with ``served`` allowed as a media host."""
    user, job = stale_job(db, kind, job_type, attempts=attempts)
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET should_watermark = :w WHERE id = :j"),
            {"w": should_watermark, "j": str(job)},
        )
    upstream = BodyUpstream()
    task_id = job_row(db, job)["provider_task_id"]
    body = success_body(kind, url, url if kind in _ONE_URL else [url], None)
    upstream.bodies[task_id] = _about_task(body, task_id)  # an answer about this row's own task
    owner = f"run-{uuid.uuid4().hex[:8]}"
    lease(db, [job], owner)
    policy = MediaPolicy(allowed_hosts=frozenset({served.host}), headers_for=upstream.media_headers)
    rec = Reconciler(
        db, upstream, LocalMediaStore(base_dir=media_dir), settings=ReconcileSettings(), media_policy=policy
    )
    return user, job, rec.reconcile(job, owner)


def _about_task(body: Any, task_id: str) -> Any:
    """``body`` with the task id it names (``taskId``, ``id``, ``dubbing_id``) set to ``task_id``."""
    if isinstance(body, dict):
        return {
            k: task_id
            if k in ("taskId", "id", "dubbing_id") and isinstance(v, str)
            else _about_task(v, task_id)
            for k, v in body.items()
        }
    return body


def stored_files(media_dir: str) -> list[Path]:
    return sorted(p for p in Path(media_dir).rglob("*") if p.is_file())


def anomaly_reasons(db: sa.Engine, job: uuid.UUID) -> list[str]:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT reason FROM credit_anomalies WHERE job_id = :j ORDER BY id"), {"j": str(job)}
        )
        return list(rows.scalars())


class BodyUpstream:
    """The real parser over bodies the test chose (the HTTP layer has its own tests), so any
    answer shape can reach the Reconciler."""

    def __init__(self) -> None:
        self.bodies: dict[str, dict[str, Any]] = {}

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        return parse_poll_response(kind, self.bodies[task_id], task_id=task_id)

    def media_headers(self, kind: str, ref: MediaRef) -> Mapping[str, str]:
        return {}


def success_body(kind: str, url: str, media: Any, text: Any) -> dict[str, Any]:
    """A documented success body of ``kind`` whose media field holds ``media`` (or ``url``)."""
    family = KINDS[kind].family.value
    if family == "kie-market":
        inner = {"resultUrls": media} if text is None else {"resultObject": text}
        return kie({"taskId": "x", "state": "success", "resultJson": json.dumps(inner)})
    if family in ("kie-veo", "kie-luma"):
        return kie({"taskId": "x", "successFlag": 1, "response": {"resultUrls": media}})
    if family == "kie-kontext":
        return kie({"taskId": "x", "successFlag": 1, "response": {"resultImageUrl": media}})
    if family == "kie-suno":
        tracks = media if not isinstance(media, list) else [{"audioUrl": m} for m in media]
        return kie({"taskId": "x", "status": "SUCCESS", "response": {"sunoData": tracks}})
    if family == "kie-runway":
        return kie({"taskId": "x", "state": "success", "expireFlag": 0, "videoInfo": {"videoUrl": media}})
    if family == "replicate-training":
        return {"id": "x", "status": "succeeded", "output": {"weights": media}}
    if family == "replicate-prediction":
        return {"id": "x", "status": "succeeded", "output": media if text is None else text}
    # ElevenLabs dubbing: the media is an authenticated endpoint named by the language code.
    return {"dubbing_id": "x", "status": "dubbed", "target_languages": media}
