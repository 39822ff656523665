"""A loopback HTTP sandbox speaking the KIE, Replicate, ElevenLabs and Anthropic APIs.

Tests use ``SandboxServer`` in-process; other processes steer it over ``{base}/_sandbox/``;
``python -m recon_dagster.sandbox`` (or ``serve_forever``) runs it standalone.
"""

from __future__ import annotations

import signal
import sys

from recon_dagster.sandbox.media import media_digest
from recon_dagster.sandbox.scenario import Scenario, ScenarioError
from recon_dagster.sandbox.server import SandboxServer

DEFAULT_API_KEY = "sandbox-key"


def serve_forever(
    host: str = "127.0.0.1", port: int = 8787, latency_s: float = 0.0, api_key: str = DEFAULT_API_KEY
) -> None:
    """Run a sandbox in the foreground until SIGINT/SIGTERM, printing the client environment."""
    server = SandboxServer(host=host, port=port, api_key=api_key, latency_s=latency_s).start()

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    print(f"recon-dagster sandbox listening on {server.base_url}", flush=True)
    for name, value in server.env().items():
        # A key chosen by the operator is not echoed; the well-known default is harmless.
        shown = value if (not name.endswith(("_KEY", "_TOKEN")) or value == DEFAULT_API_KEY) else "***"
        print(f"{name}={shown}", flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        print("sandbox stopped", file=sys.stderr, flush=True)


__all__ = ["Scenario", "ScenarioError", "SandboxServer", "media_digest", "serve_forever"]
