"""``python -m recon_dagster.sandbox --port 8787``: run the provider sandbox standalone."""

from __future__ import annotations

import argparse

from recon_dagster.sandbox import DEFAULT_API_KEY, serve_forever


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m recon_dagster.sandbox",
        description="Serve look-alike APIs of every registered provider on loopback.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787, help="0 picks a free port")
    parser.add_argument(
        "--latency",
        type=float,
        default=0.0,
        dest="latency_s",
        help="seconds every provider call sleeps before answering",
    )
    parser.add_argument(
        "--api-key", default=DEFAULT_API_KEY, help="the key clients must present (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.latency_s < 0:
        parser.error("--latency must be >= 0")
    serve_forever(args.host, args.port, args.latency_s, api_key=args.api_key)


if __name__ == "__main__":
    main()
