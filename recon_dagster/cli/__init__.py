"""``recon-dagster``: the command line. ``main`` is the console script; one module per command."""

from recon_dagster.cli.commands import main

__all__ = ["main"]
