"""Peak memory of one poll answered with a gzip bomb, with the decoded-size cap and without it.

    .venv/bin/python benchmarks/poll_bomb.py                 # 256 MiB decoded, cap 8 MiB vs 1 GiB
    .venv/bin/python benchmarks/poll_bomb.py --decoded-mb 64

The sandbox (in this process) answers a KIE poll with a gzip body of a few hundred KiB that
inflates to ``--decoded-mb``. Each case polls once in a fresh child process through the real
``KieResource`` and prints the child's peak RSS (``VmHWM``) after imports and after the poll, the
outcome and the seconds taken. "uncapped" sets ``max_body_bytes`` to 1 GiB: what a poll cost
before the cap existed (the whole body decoded in memory, then its text and a JSON parse).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MIB = 1024 * 1024

_CHILD = r"""
import json, sys, time
from recon_dagster.providers.kie import KieResource

def hwm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")

base_url, key, task, cap = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kie = KieResource(base_url=base_url, api_key=key, max_body_bytes=cap, read_deadline_s=120)
before = hwm_mb()
started = time.perf_counter()
try:
    kie.poll("kie-standard", task)
    outcome = "parsed"
except Exception as exc:
    outcome = f"{type(exc).__name__}: {str(exc)[:90]}"
print(json.dumps({"imports_mb": before, "peak_mb": hwm_mb(), "s": time.perf_counter() - started,
                  "outcome": outcome}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decoded-mb", type=int, default=256)
    args = parser.parse_args()

    from recon_dagster.sandbox import SandboxServer, Scenario

    with SandboxServer(api_key="bench-key-0123456789") as sandbox:
        for label, cap in (("capped (default 8 MiB)", 8 * MIB), ("uncapped (1 GiB)", 1024 * MIB)):
            task = sandbox.add_task("kie-standard", Scenario(poll_gzip_bytes=args.decoded_mb * MIB))
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _CHILD,
                    sandbox.api_base_url("kie"),
                    "bench-key-0123456789",
                    task,
                    str(cap),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{args.decoded_mb} MiB gzip bomb, {label}: peak RSS {r['peak_mb']:.1f} MB "
                f"(after imports {r['imports_mb']:.1f} MB, growth {r['peak_mb'] - r['imports_mb']:.1f} MB), "
                f"{r['s']:.2f} s; {r['outcome']}"
            )


if __name__ == "__main__":
    main()
