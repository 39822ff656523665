"""``explain_job``: find any job from the Dagster UI. Launch it from the Launchpad with a job id;
the run's log and its output metadata carry the job's whole story (``recon_dagster.operator.explain``)."""

from typing import Any

import dagster as dg
from pydantic import Field

from recon_dagster.core.runtags import ROLE_TAG
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.operator.explain import (
    ExplainError,
    explain,
    facts,
    run_url,
    runs_in_order,
    to_json,
    to_markdown,
    ui_base_url,
)


class ExplainJobConfig(dg.Config):
    """Which job to explain."""

    job_id: str = Field(description="The app's jobs.id (a UUID), e.g. from a user's report or a run's log.")


@dg.op(out=dg.Out(dict))
def explain_job_story(
    context: dg.OpExecutionContext, config: ExplainJobConfig, database: DatabaseResource
) -> dg.Output[dict[str, Any]]:
    """Read one job's attempts, runs, upstream answers, outcome, credits and assets; log and
    report them. An unknown or malformed id fails the run with a one-line reason."""
    # Inside the UI a relative link is always right; RECON_DAGSTER_UI_URL makes it absolute.
    base = ui_base_url(default=None)
    try:
        story = explain(database.get_engine(), context.instance, config.job_id)
    except ExplainError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    context.log.info("\n".join(f"{k}: {v}" for k, v in facts(story)))
    for a in story.attempts:
        run = run_url(a.run_id, base) if a.run_id else f"run key {a.run_key} (run not found)"
        context.log.info(f"attempt {a.attempt} at {a.at:%Y-%m-%d %H:%M:%S}: {a.outcome} - {a.detail} [{run}]")
    return dg.Output(
        to_json(story, base),
        metadata={
            "job_id": story.job_id,
            "outcome": story.outcome,
            "provider_kind": story.provider_kind or "none",
            "provider_task_id": story.provider_task_id or "none",
            # The job's own counter (what the cap counts), and the rows of its story (operator
            # actions and skipped claims included): two numbers, named so they are never confused.
            "reconcile_attempts": story.reconcile_attempts,
            "story_events": len(story.attempts),
            "story": dg.MetadataValue.md(to_markdown(story, base)),
            **{label: dg.MetadataValue.url(run_url(r, base)) for label, r in runs_in_order(story)[:20]},
        },
    )


@dg.job(
    executor_def=dg.in_process_executor,
    description="Find any job: launch with ops.explain_job_story.config.job_id set to a jobs.id; the "
    "run's log and metadata show every reconcile attempt with its run link, what upstream said, the "
    "outcome, credits committed or refunded, the provider task id and the job's assets.",
    tags={ROLE_TAG: "explain"},
)
def explain_job() -> None:
    explain_job_story()
