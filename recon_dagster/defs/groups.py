"""The Catalog's asset groups. Dagster lists groups by name, so ``recon_oncall`` (what an on-call
engineer opens first: the open incidents, provider health, the stuck jobs) comes before
``reconciliation`` (what the runs did, for analysis) and ``spend``."""

ONCALL = "recon_oncall"
RECONCILIATION = "reconciliation"
