/**
 * What went wrong, typed. `resumable` says whether the queue should retry the job: a retried
 * handler starts at `resume_point` again, so retrying is safe whenever it is true.
 */

export class ContractError extends Error {
  /** Retry the job (BullMQ: throw it on; the retry resumes or waits, it never creates twice). */
  readonly resumable: boolean;
  constructor(message: string, resumable: boolean) {
    super(message);
    this.name = new.target.name;
    this.resumable = resumable;
  }
}

/** The database's contract is older than this package (or missing): run `recon-dagster migrate`. */
export class ContractMismatch extends ContractError {
  constructor(message: string) {
    super(message, false);
  }
}

/** The job is gone or no longer in flight: start no upstream work, stop polling. */
export class JobStopped extends ContractError {
  constructor(
    readonly jobId: string,
    readonly reason: "job_not_found" | "job_not_in_flight",
    readonly status: string | null,
    message: string,
  ) {
    super(message, false);
  }
}

/**
 * A create may have made a task the job's row does not name: its answer was lost (this attempt),
 * or the ledger holds an earlier attempt's create still unanswered. Creating again could bill
 * twice, so nothing is created: recon_dagster's orphan sweep adopts the task onto the row (a
 * later retry then resumes it) or finds none (a later retry creates).
 */
export class AmbiguousCreate extends ContractError {
  constructor(
    readonly jobId: string,
    readonly createId: string,
    message: string,
    readonly cause?: unknown,
  ) {
    super(message, true);
  }
}

/** The request was not sent: no token within the wait bound, the account blocked by a
 * Retry-After, or no concurrency slot. Retry after `retryInS`. */
export class NotSent extends ContractError {
  constructor(
    readonly reason: "token_wait" | "blocked_by_retry_after" | "slot_wait",
    readonly retryInS: number,
    message: string,
  ) {
    super(message, true);
  }
}

/** Polling used its budget before the task ended. The task id is on the row: a retry resumes it
 * (and the reconciler finishes it if no retry comes). */
export class PollBudgetExceeded extends ContractError {
  constructor(
    readonly taskId: string,
    readonly attempts: number,
  ) {
    super(`task ${taskId} not finished after ${attempts} polls; the row names it, a retry resumes it`, true);
  }
}

/** A function answered `fix_call`: a bug in the caller's arguments. */
export class ContractCallError extends ContractError {
  constructor(readonly reason: string, message: string) {
    super(message, false);
  }
}
