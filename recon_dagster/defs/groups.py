"""The Catalog's asset groups. ``recon_oncall`` holds what an on-call engineer opens first (the
incidents open now, provider health, the stuck jobs); ``reconciliation`` what the runs did, for
analysis; ``spend`` the bills. Dagster lists groups by name (Lineage), so ``recon_oncall`` comes
first; its Catalog is one table sorted by asset name, where ``active_incidents`` is the first row."""

ONCALL = "recon_oncall"
RECONCILIATION = "reconciliation"
