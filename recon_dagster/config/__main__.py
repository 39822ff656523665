"""``python -m recon_dagster.config --markdown``: print docs/configuration.md."""

import sys

from recon_dagster.config.docs import main

raise SystemExit(main(sys.argv[1:]))
