"""The declarations of ``recon_dagster.config.Settings``, one module per group of settings."""
