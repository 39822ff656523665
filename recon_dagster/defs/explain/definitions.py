"""Find any job: ``job_story`` (a page per worked job, no run to launch) and, for any job id at all,
``explain_job`` from the Launchpad."""

import dagster as dg

from recon_dagster.defs.explain.explain_job import explain_job
from recon_dagster.defs.explain.stories import job_story

defs = dg.Definitions(assets=[job_story], jobs=[explain_job])
