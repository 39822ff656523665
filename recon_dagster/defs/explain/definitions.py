"""Find any job from the Launchpad: ``explain_job`` tells one job's whole story."""

import dagster as dg

from recon_dagster.defs.explain.explain_job import explain_job

defs = dg.Definitions(jobs=[explain_job])
