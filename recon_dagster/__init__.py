"""recon_dagster: reconcile external provider calls that outlived the worker that made them."""

__version__ = "0.1.0"
