"""Talking to the providers: the poll deadline, answer size, Replicate's Cancel-After, and how the
providers' budgets are shared (the per-provider ``RECON_LIMIT_*`` come from each provider's spec).

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.parse import (
    FLAG_BOUNDS,
    FLAG_VALUES,
    LimitsConfigError,
    choice,
    knob,
    positive,
)
from recon_dagster.config.var import POSITIVE, WEEK_S, setting


class ProviderIoGroup:
    __slots__ = ()

    # fmt: off
    # provider I/O
    poll_deadline_s = setting(
        "provider I/O", "seconds", 60.0,
        "Overall deadline of one poll or read, retries and backoff included, however slowly the answer "
        "drips, headers included (every socket read and write is cut to what is left; past it the connection "
        "is closed and the error says how long it waited). A rate token or concurrency slot that would come "
        "later is not waited for (and the token not taken): the request is not sent, which is not an attempt "
        "(the job is rescheduled, reason recorded); a create's wait is bounded by `RECON_LEASE_S`.",
        parse=positive(float), bounds=POSITIVE,
    )
    replicate_cancel_after_s = setting(
        "provider I/O", "seconds", None,
        "`Cancel-After` of every Replicate create from the worker library: Replicate cancels the prediction "
        "or training itself this many seconds after it was created, so a task nobody collects stops even if "
        "the orphan sweep never sees it. Unset: the kind's stale threshold plus `RECON_MAX_ATTEMPTS` x "
        "`RECON_RECONCILE_CADENCE_S` (when the reconciler gives up on the job anyway: 110 min for "
        "`replicate-prediction`, 120 min for `replicate-training` by default); `0`: no header.",
        parse=knob(float, 0, WEEK_S), bounds=f"0, or 5-{WEEK_S}", shown_default="derived per kind",
    )
    poll_max_bytes = setting(
        "provider I/O", "bytes", 8 * 1024 * 1024,
        "Decoded size cap of one provider answer, inflated step by step so a gzip bomb stops here (status "
        "bodies are a few KiB).",
        parse=positive(int), bounds=POSITIVE, shown_default="8388608 (8 MiB)",
    )
    limits = setting(
        "provider budgets", "choice", True,
        "`database`: every process shares one budget per provider account through the app's PostgreSQL "
        "(migration 140); `process`: per-process limits only (each process a whole budget).",
        parse=choice(
            {"database": True, "shared": True, "process": False, "local": False}, "'database' or 'process'",
            LimitsConfigError,
        ),
        bounds="`database` (`shared`), `process` (`local`)", shown_default="`database`",
    )
    limits_migrate = setting(
        "provider budgets", "flag", False,
        "`1`: this process's `RECON_LIMIT_*` budgets replace the account's shared rows. Without it a process "
        "whose budget differs from the account's row refuses to start (`reconcile --once` exits 1 with one "
        "line naming both budgets; a run's requests fail the same way), so one misconfigured process cannot "
        "lower or raise every process's budget.",
        parse=choice(FLAG_VALUES, "1 or 0", LimitsConfigError), bounds=FLAG_BOUNDS, shown_default="`0`",
    )
    # fmt: on
