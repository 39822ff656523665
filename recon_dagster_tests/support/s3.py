"""An S3 endpoint (moto's server on loopback) and a dagster-aws resource on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dagster_aws.s3 import S3Resource
from moto.server import ThreadedMotoServer

from recon_dagster.media.store import S3MediaStore
from recon_dagster_tests.support.topology import free_port

BUCKET = "recon-media-test"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = S3MediaStore(s3=s3_resource(endpoint), bucket=BUCKET)._get_client()
    client.create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


def s3_resource(endpoint: str) -> S3Resource:
    return S3Resource(
        endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )
