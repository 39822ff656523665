"""What the reconciler decides and how often: attempts, cadence, lease, batches, modes, the
not-found breaker and the orphan sweep.

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.parse import (
    choice,
    knob,
    name_list,
    positive,
)
from recon_dagster.config.var import DAY_S, POSITIVE, WEEK_S, number, setting, whole


class ReconcileGroup:
    __slots__ = ()

    # fmt: off
    # reconcile
    max_attempts = whole(18, 1, 1000, "Reconcile attempts before force-fail + refund + anomaly.")
    reconcile_cadence_s = number(
        300, 0, WEEK_S, "Minimum spacing of attempts on one job in seconds (18 x 5 min ~= 90 min).",
    )
    lease_s = number(
        900, 1, WEEK_S,
        "Reconcile lease a run takes on its jobs when it starts (a crashed run frees its jobs after this); "
        "also the age past which a partial media write (`.part`) is removed as dead.",
    )
    reconcile_concurrency = whole(16, 1, 1000, "Jobs worked at once inside one run.")
    batch_size = whole(
        2000, 1, 100_000,
        "Most jobs of one kind packed into one run during a backlog (lowered where a read budget could not "
        "poll a batch within half the lease). Each run costs its worker process about 1.5-3 s of CPU to "
        "start, so a backlog is best drained in few runs.",
    )
    single_run_below = whole(10, 0, 100_000, "Fewer due jobs of a kind than this: one run per job.")
    scan_limit = whole(
        20_000, 1, 1_000_000,
        "Most stale rows dispatched per sensor tick (shared by the kinds due; a kind gets one run per "
        "`RECON_BATCH_SIZE` of its rows).",
    )
    sensor_interval_s = setting(
        "reconcile", "whole seconds", 30,
        "Seconds between sensor ticks (tests and benchmarks shorten it; the daemon's sensor loop itself "
        "wakes every 5 s at most).",
        parse=knob(int, 1, 86_400), bounds="1-86400",
    )
    precall_budget_s = setting(
        "reconcile", "seconds", 3 * 3600.0,
        "Pre-call budget: a row with no `provider_call_started_at` (queued, in pre-call work, or pre-135 "
        "legacy) is swept only this many seconds after `COALESCE(started_at, created_at)`.",
        parse=positive(float, "a positive number of seconds (e.g. 10800 for 3 hours)"), bounds=POSITIVE,
        shown_default="10800 (3 h)",
    )
    mode = setting(
        "reconcile", "choice", "enforce",
        "`shadow`: the sensor, runs and sweep record each decision in `reconcile_decisions` (once per job "
        "per cadence) and change nothing else ([rollout.md](rollout.md)).",
        parse=choice({"shadow": "shadow", "enforce": "enforce"}, "shadow or enforce", echo_as_given=True),
        bounds="`enforce`, `shadow`",
    )
    enforce_kinds = setting(
        "reconcile", "list of kinds", frozenset[str](),
        "Comma list of provider kinds that act whatever `RECON_MODE` says.", parse=name_list,
        bounds="known provider kinds, none also in `RECON_SHADOW_KINDS`", shown_default="—",
    )
    shadow_kinds = setting(
        "reconcile", "list of kinds", frozenset[str](),
        "Comma list of provider kinds that only decide, whatever `RECON_MODE` says.", parse=name_list,
        bounds="known provider kinds, none also in `RECON_ENFORCE_KINDS`", shown_default="—",
    )
    not_found_burst = setting(
        "reconcile", "whole number", 5,
        "Not-found breaker: more than this many not-found poll answers of one provider kind (or of one "
        "provider) within the window (and more than `RECON_NOT_FOUND_SHARE` of its answers) stop failing "
        "jobs on not-found for that kind (for every kind of that provider).",
        parse=knob(int, 0, 1_000_000), bounds="0-1000000",
    )
    not_found_share = setting(
        "reconcile", "number", 0.5,
        "Share of a kind's (or provider's) answers in the window the not-found answers must exceed to open "
        "its breaker.",
        parse=knob(float, 0.0, 0.999), bounds="0-0.999",
    )
    not_found_window_s = setting(
        "reconcile", "seconds", 600.0,
        "The breaker's window; answers older than this are pruned from `provider_poll_answers`.",
        parse=knob(float, 1.0, WEEK_S), bounds=f"1-{WEEK_S}",
    )
    orphan_window_s = setting(
        "reconcile", "seconds", 6 * 3600.0,
        "How far back the orphan sweep (`upstream_orphans`, `recon-dagster orphans`) lists each provider's "
        "tasks and reads the create ledger, when no `--since` is given.",
        parse=knob(float, 60, 30 * DAY_S), bounds=f"60-{30 * DAY_S}", shown_default="21600 (6 h)",
    )
    orphan_grace_s = setting(
        "reconcile", "seconds", 120.0,
        "A task younger than this is left alone by the orphan sweep: its worker may still be recording it.",
        parse=knob(float, 0, DAY_S), bounds=f"0-{DAY_S}",
    )
    orphan_look_wait_s = setting(
        "reconcile", "seconds", 6 * 3600.0,
        "The sweep leaves a job whose create was ambiguous (at a provider that can list its tasks) alone "
        "until the orphan sweep has looked for its task, at most this long after the create.",
        parse=knob(float, 0, 30 * DAY_S), bounds=f"0-{30 * DAY_S}", shown_default="21600 (6 h)",
    )
    # fmt: on
