"""MediaStore against a real folder and a real S3-compatible server (moto in server mode)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from recon_dagster.media.errors import MediaExpired, MediaTooLarge
from recon_dagster.media.folder import FolderWriter
from recon_dagster.media.s3 import S3ClientSettings, S3Writer, build_s3_client, shared_s3_client
from recon_dagster.media.store import (
    LocalMediaStore,
    MediaStore,
    S3MediaStore,
    guess_ext,
    media_key,
    media_store_from_env,
)
from recon_dagster.media.transfer import fetch_bytes, fetch_to_store
from recon_dagster_tests.support.media_server import MediaServer, pattern_bytes
from recon_dagster_tests.support.s3 import BUCKET, s3_resource

MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def media_server() -> Iterator[MediaServer]:
    with MediaServer() as srv:
        yield srv


def make_store(kind: str, tmp_path: Path, endpoint: str | None) -> LocalMediaStore | S3MediaStore:
    if kind == "local":
        return LocalMediaStore(base_dir=str(tmp_path / "media"))
    assert endpoint is not None
    # A fresh prefix per test keeps tests independent inside one bucket.
    return S3MediaStore(
        s3=s3_resource(endpoint), bucket=BUCKET, prefix=f"t-{uuid.uuid4().hex[:8]}/", part_size=5 * MIB
    )


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> LocalMediaStore | S3MediaStore:
    endpoint = request.getfixturevalue("moto_endpoint") if request.param == "s3" else None
    return make_store(request.param, tmp_path, endpoint)


def leftovers(store: LocalMediaStore | S3MediaStore) -> list[str]:
    """Every stored object and unfinished upload, so a test can assert nothing partial remains."""
    if isinstance(store, LocalMediaStore):
        base = Path(store.base_dir)
        return (
            sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) if base.exists() else []
        )
    client = store._get_client()
    objects = client.list_objects_v2(Bucket=BUCKET, Prefix=store.prefix).get("Contents", [])
    uploads = client.list_multipart_uploads(Bucket=BUCKET, Prefix=store.prefix).get("Uploads", [])
    return sorted([o["Key"][len(store.prefix) :] for o in objects] + [f"upload:{u['Key']}" for u in uploads])


def chunks_of(data: bytes, size: int = 256 * 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def failing_after(data: bytes, fail_at: int) -> Iterator[bytes]:
    sent = 0
    for chunk in chunks_of(data):
        if sent >= fail_at:
            raise ConnectionResetError("upstream went away")
        sent += len(chunk)
        yield chunk


# --- round trips -------------------------------------------------------------------------------


def test_store_is_a_media_store(store: MediaStore) -> None:
    assert isinstance(store, MediaStore)


def test_round_trip(store: LocalMediaStore | S3MediaStore) -> None:
    data = pattern_bytes(700_000)
    key = media_key("job-1", "image-ai", 0, "png")
    stored = store.put_stream(key, chunks_of(data), "image/png")
    assert stored.key == key
    assert stored.size == len(data)
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    assert store.exists(key)
    assert store.read_bytes(key) == data
    assert stored.url.endswith(key)
    assert stored.url.startswith("file://" if isinstance(store, LocalMediaStore) else f"s3://{BUCKET}/")
    store.delete(key)
    assert not store.exists(key)
    store.delete(key)  # absent is fine
    assert leftovers(store) == []


def test_missing_object(store: LocalMediaStore | S3MediaStore) -> None:
    assert not store.exists("images/none/0.png")
    with pytest.raises(FileNotFoundError):
        store.read_bytes("images/none/0.png")


def test_empty_object(store: LocalMediaStore | S3MediaStore) -> None:
    stored = store.put_stream("files/j/0.bin", iter(()), "application/octet-stream")
    assert stored.size == 0
    assert store.read_bytes("files/j/0.bin") == b""


def test_repeated_upload_overwrites_one_object(store: LocalMediaStore | S3MediaStore) -> None:
    key = media_key("job-2", "video-ai", 0, "mp4")
    store.put_stream(key, [b"first version"], "video/mp4")
    second = store.put_stream(key, [b"second", b" version"], "video/mp4")
    assert store.read_bytes(key) == b"second version"
    assert second.size == len(b"second version")
    assert leftovers(store) == [key]


@pytest.mark.parametrize("fail_at", [0, 300_000, 12 * MIB], ids=["at-once", "small", "after-two-parts"])
def test_failing_iterator_leaves_nothing(store: LocalMediaStore | S3MediaStore, fail_at: int) -> None:
    key = media_key("job-3", "video-ai", 0, "mp4")
    with pytest.raises(ConnectionResetError, match="upstream went away"):
        store.put_stream(key, failing_after(pattern_bytes(20 * MIB), fail_at), "video/mp4")
    assert not store.exists(key)
    assert leftovers(store) == []


def test_failing_iterator_keeps_the_previous_object(store: LocalMediaStore | S3MediaStore) -> None:
    key = media_key("job-4", "video-ai", 0, "mp4")
    store.put_stream(key, [b"good"], "video/mp4")
    with pytest.raises(ConnectionResetError):
        store.put_stream(key, failing_after(pattern_bytes(12 * MIB), 11 * MIB), "video/mp4")
    assert store.read_bytes(key) == b"good"
    assert leftovers(store) == [key]


def test_large_object_uses_multipart(moto_endpoint: str, tmp_path: Path) -> None:
    store = make_store("s3", tmp_path, moto_endpoint)
    data = pattern_bytes(20 * 1000 * 1000)
    key = media_key("job-5", "video-ai", 0, "mp4")
    stored = store.put_stream(key, chunks_of(data, 1 * MIB + 7), "video/mp4")
    assert stored.size == len(data)
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    head = store._get_client().head_object(Bucket=BUCKET, Key=store.prefix + key)
    # A multipart object's ETag is "<md5-of-md5s>-<part count>": 20 MB in 5 MiB parts is 4 parts.
    assert head["ETag"].strip('"').endswith("-4")
    assert head["ContentType"] == "video/mp4"
    assert store.read_bytes(key) == data


@pytest.mark.parametrize(
    ("size", "chunk", "parts"),
    [
        (3 * 5 * MIB, 5 * MIB, 3),  # chunks aligned with parts, last part exactly full
        (5 * MIB + 1, 5 * MIB + 1, 2),  # one chunk just over a part
        (12 * MIB + 3, 12 * MIB + 3, 3),  # one chunk spanning several parts
        (10 * MIB + 9, 64 * 1024, 3),  # socket-sized chunks, a 9-byte last part
    ],
    ids=["aligned", "one-over", "one-huge-chunk", "small-chunks"],
)
def test_multipart_part_boundaries(
    moto_endpoint: str, tmp_path: Path, size: int, chunk: int, parts: int
) -> None:
    # The part buffer is reused between parts: every byte must land once, in order. Random
    # bytes, because a periodic pattern would hide a part filled from the wrong offset.
    store = make_store("s3", tmp_path, moto_endpoint)
    data = random.Random(size).randbytes(size)
    key = media_key("job-parts", "video-ai", 0, "mp4")
    stored = store.put_stream(key, chunks_of(data, chunk), "video/mp4")
    assert (stored.size, stored.sha256) == (size, hashlib.sha256(data).hexdigest())
    head = store._get_client().head_object(Bucket=BUCKET, Key=store.prefix + key)
    assert head["ETag"].strip('"').endswith(f"-{parts}")
    assert head["ContentLength"] == size
    assert store.read_bytes(key) == data


def test_small_object_uses_single_put(moto_endpoint: str, tmp_path: Path) -> None:
    store = make_store("s3", tmp_path, moto_endpoint)
    store.put_stream("images/j/0.png", [b"x" * 1000], "image/png")
    head = store._get_client().head_object(Bucket=BUCKET, Key=store.prefix + "images/j/0.png")
    assert "-" not in head["ETag"].strip('"')
    assert head["Metadata"]["sha256"] == hashlib.sha256(b"x" * 1000).hexdigest()


def test_part_size_below_s3_minimum_is_refused(moto_endpoint: str) -> None:
    store = S3MediaStore(s3=s3_resource(moto_endpoint), bucket=BUCKET, part_size=MIB)
    with pytest.raises(ValueError, match="5242880"):
        store.put_stream("files/j/0.bin", [b"x"], "application/octet-stream")


@pytest.mark.parametrize("key", ["../escape.png", "/abs/key.png", "a//b.png", "a/./b.png", "a/b c.png", ""])
def test_unsafe_keys_are_refused(store: LocalMediaStore | S3MediaStore, key: str) -> None:
    with pytest.raises(ValueError, match="media key"):
        store.put_stream(key, [b"x"], "image/png")
    assert leftovers(store) == []


def test_put_stream_from_many_threads(store: LocalMediaStore | S3MediaStore) -> None:
    errors: list[BaseException] = []
    payloads = {media_key(f"job-t{i}", "image", 0, "png"): pattern_bytes(200_000 + i, i) for i in range(8)}

    def put(key: str, data: bytes) -> None:
        try:
            store.put_stream(key, chunks_of(data, 50_000), "image/png")
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=item) for item in payloads.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for key, data in payloads.items():
        assert store.read_bytes(key) == data


# --- download into a store ---------------------------------------------------------------------


def test_download_into_store(store: LocalMediaStore | S3MediaStore, media_server: MediaServer) -> None:
    def key_for(stream: object) -> str:
        return media_key("job-6", "image-ai", 0, guess_ext(stream.content_type))  # type: ignore[attr-defined]

    stored = fetch_to_store(
        media_server.url("/bytes?n=6000000&type=image/png"),
        store,
        key_for,
        max_bytes=10 * MIB,
        allowed_hosts={media_server.host},
    )
    assert stored.key == "images/job-6/0.png"
    assert store.read_bytes(stored.key) == pattern_bytes(6_000_000)


def test_download_over_cap_stores_nothing(
    store: LocalMediaStore | S3MediaStore, media_server: MediaServer
) -> None:
    key = media_key("job-7", "video-ai", 0, "mp4")
    with pytest.raises(MediaTooLarge):
        fetch_to_store(
            media_server.url("/huge?limit=1073741824"),
            store,
            key,
            max_bytes=11 * MIB,
            allowed_hosts={media_server.host},
        )
    assert not store.exists(key)
    assert leftovers(store) == []


def test_expired_media_stores_nothing(
    store: LocalMediaStore | S3MediaStore, media_server: MediaServer
) -> None:
    with pytest.raises(MediaExpired):
        fetch_to_store(
            media_server.url("/status/403"),
            store,
            "images/j/0.png",
            max_bytes=MIB,
            allowed_hosts={media_server.host},
        )
    assert leftovers(store) == []


def test_fetch_bytes(media_server: MediaServer) -> None:
    data, content_type = fetch_bytes(
        media_server.url("/bytes?n=1000&type=image/jpeg"), max_bytes=2000, allowed_hosts={media_server.host}
    )
    assert data == pattern_bytes(1000)
    assert content_type == "image/jpeg"


# --- configuration and Dagster wiring ----------------------------------------------------------


def test_from_env_defaults_to_local(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RECON_S3_BUCKET", raising=False)
    monkeypatch.setenv("RECON_MEDIA_DIR", str(tmp_path / "m"))
    store = media_store_from_env()
    assert isinstance(store, LocalMediaStore)
    assert store.base_dir == str(tmp_path / "m")
    monkeypatch.delenv("RECON_MEDIA_DIR")
    monkeypatch.chdir(tmp_path)
    default = media_store_from_env()
    assert isinstance(default, LocalMediaStore)
    assert Path(default.base_dir) == tmp_path / ".recon" / "media"


@pytest.mark.slow
def test_from_env_s3_in_and_out_of_dagster(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> None:
    secret = "s3cr3t-value-never-shown"
    monkeypatch.setenv("RECON_S3_BUCKET", BUCKET)
    monkeypatch.setenv("RECON_S3_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("RECON_S3_PREFIX", "envtest")
    store = media_store_from_env()
    assert isinstance(store, S3MediaStore)
    # Outside a run the EnvVar fields are resolved when the client is built.
    stored = store.put_stream("images/env/0.png", [b"direct"], "image/png")
    assert stored.url == f"s3://{BUCKET}/envtest/images/env/0.png"
    assert store.read_bytes("images/env/0.png") == b"direct"

    @dg.op
    def upload(media_store: S3MediaStore) -> str:
        assert secret not in repr(media_store) and secret not in str(media_store)
        return media_store.put_stream("images/env/1.png", [b"in a run"], "image/png").url

    @dg.job
    def upload_job() -> None:
        upload()

    defs = dg.Definitions(jobs=[upload_job], resources={"media_store": store})
    result = defs.get_job_def("upload_job").execute_in_process()
    assert result.success
    assert store.read_bytes("images/env/1.png") == b"in a run"
    assert secret not in repr(store)
    assert secret not in str(result.dagster_run.run_config)


# --- the Dagster-free writers ------------------------------------------------------------------

# Runs in a fresh interpreter: moves one object through the production path (open_media_stream ->
# fetch_to_store -> plain writer) into a folder and into S3, then reports which heavy packages
# were imported along the way.
_DAGSTER_FREE_MOVE = """
import json, sys
from recon_dagster.media import FolderWriter, S3Writer, fetch_to_store, media_key
from recon_dagster.media.s3 import S3ClientSettings, shared_s3_client
imported_before_move = sorted(m for m in sys.modules if m.split(".")[0] in ("boto3", "dagster"))
url, host, endpoint, bucket, base_dir = sys.argv[1:6]
settings = S3ClientSettings(endpoint_url=endpoint, region_name="us-east-1",
                            aws_access_key_id="test", aws_secret_access_key="test")
writers = {
    "folder": FolderWriter(base_dir),
    "s3": S3Writer(bucket, client_factory=lambda: shared_s3_client(settings), prefix="plain-sub/",
                   part_size=5 * 1024 * 1024),
}
sizes = {}
for name, writer in writers.items():
    key = media_key("job-sub", "video-ai", 0, "mp4")
    stored = fetch_to_store(url, writer, key, max_bytes=1 << 30, allowed_hosts={host})
    sizes[name] = [stored.size, stored.sha256, len(writer.read_bytes(key))]
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"dagster", "dagster_aws", "pydantic"})
print(json.dumps({"before": imported_before_move, "heavy": heavy, "sizes": sizes}))
"""


@pytest.mark.slow
def test_production_move_path_imports_no_dagster(
    media_server: MediaServer, moto_endpoint: str, tmp_path: Path
) -> None:
    n = 11 * MIB + 5  # more than two 5 MiB parts: the multipart path runs in S3
    answer = subprocess.run(
        [
            sys.executable,
            "-c",
            _DAGSTER_FREE_MOVE,
            media_server.url(f"/bytes?n={n}&type=video/mp4"),
            media_server.host,
            moto_endpoint,
            BUCKET,
            str(tmp_path / "media"),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert answer.returncode == 0, answer.stderr[-3000:]
    report = json.loads(answer.stdout.strip().splitlines()[-1])
    expected = [n, hashlib.sha256(pattern_bytes(n)).hexdigest(), n]
    assert report["sizes"] == {"folder": expected, "s3": expected}
    # Importing the writers costs neither boto3 (built lazily) nor dagster; moving costs no dagster.
    assert report["before"] == []
    assert report["heavy"] == []


def test_wrappers_delegate_to_the_plain_writers(moto_endpoint: str, tmp_path: Path) -> None:
    local = LocalMediaStore(base_dir=str(tmp_path / "m"))
    local.put_stream("images/j/0.png", [b"abc"], "image/png")
    # What one wrote the other reads: same layout, same keys.
    assert FolderWriter(tmp_path / "m").read_bytes("images/j/0.png") == b"abc"
    s3_store = make_store("s3", tmp_path, moto_endpoint)
    plain = S3Writer(BUCKET, client=s3_store._get_client(), prefix=s3_store.prefix)
    plain.put_stream("images/j/1.png", [b"from plain"], "image/png")
    assert s3_store.read_bytes("images/j/1.png") == b"from plain"
    assert s3_store.writer() is s3_store.writer()


def test_s3_writer_with_public_url_and_client(moto_endpoint: str) -> None:
    client = shared_s3_client(
        S3ClientSettings(
            endpoint_url=moto_endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
    )
    writer = S3Writer(BUCKET, client=client, prefix="/pub/", public_base_url="https://cdn.example/m/")
    stored = writer.put_stream("images/p/0.png", [b"x" * 10], "image/png")
    assert stored.url == "https://cdn.example/m/pub/images/p/0.png"
    assert client.get_object(Bucket=BUCKET, Key="pub/images/p/0.png")["Body"].read() == b"x" * 10
    assert isinstance(writer, MediaStore) and isinstance(FolderWriter("x"), MediaStore)


def test_s3_writer_builds_its_client_once_across_threads(moto_endpoint: str) -> None:
    settings = S3ClientSettings(
        endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )
    calls: list[int] = []
    gate = threading.Barrier(6)

    def factory() -> object:
        calls.append(1)
        return build_s3_client(settings)

    writer = S3Writer(BUCKET, client_factory=factory, prefix=f"once-{uuid.uuid4().hex[:6]}/")
    clients: list[object] = []

    def use() -> None:
        gate.wait()
        clients.append(writer.client)

    threads = [threading.Thread(target=use) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len({id(c) for c in clients}) == 1
    assert not writer.exists("images/none/0.png")


def test_shared_client_per_distinct_settings() -> None:
    a = S3ClientSettings(endpoint_url="http://127.0.0.1:1", region_name="us-east-1")
    same = S3ClientSettings(endpoint_url="http://127.0.0.1:1", region_name="us-east-1")
    other = S3ClientSettings(endpoint_url="http://127.0.0.1:2", region_name="us-east-1")
    assert shared_s3_client(a) is shared_s3_client(same)
    assert shared_s3_client(a) is not shared_s3_client(other)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bucket": ""}, "bucket"),
        ({"bucket": "b", "client": None}, "exactly one"),
        ({"bucket": "b", "client": object(), "client_factory": object}, "exactly one"),
        ({"bucket": "b", "client": object(), "part_size": MIB}, "5242880"),
        ({"bucket": "b", "client": object(), "part_size": "8MB"}, "part_size"),
    ],
)
def test_s3_writer_refuses_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        S3Writer(**kwargs)


def test_folder_writer_refuses_an_empty_base_dir() -> None:
    with pytest.raises(ValueError, match="base_dir"):
        FolderWriter("")


def test_plain_classes_never_show_secrets(moto_endpoint: str) -> None:
    secret = "plain-s3cr3t-never-shown"
    settings = S3ClientSettings(
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="AKIDNEVERSHOWN",
        aws_secret_access_key=secret,
        aws_session_token=secret + "-token",
    )
    writer = S3Writer(BUCKET, client_factory=lambda: shared_s3_client(settings))
    writer.client  # noqa: B018 (build it, so a repr could reach resolved credentials)
    for text in (repr(settings), str(settings), repr(writer), str(writer)):
        assert secret not in text
        assert "AKIDNEVERSHOWN" not in text


@pytest.mark.slow
def test_the_code_location_loads_without_dagster_aws_when_media_is_local():
    # Every run worker imports the code location; dagster_aws (its components, boto3) was ~40% of
    # that import. It is loaded only when the S3 store is configured or asked for by name.
    env = {k: v for k, v in os.environ.items() if k != "RECON_S3_BUCKET"}
    code = "import sys, recon_dagster.definitions; print('dagster_aws' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
