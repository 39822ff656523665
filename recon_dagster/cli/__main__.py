"""``python -m recon_dagster.cli``: the same command as the ``recon-dagster`` script."""

import sys

from recon_dagster.cli import main

sys.exit(main())
