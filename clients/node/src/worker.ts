/**
 * A worker's steps of the contract (docs/app-contract.md) around the app's own provider calls:
 * a sync call's start, and `runOrResume` for an async create (resume what the row names, refuse
 * a create the ledger says may exist, record the intent, send, record the answer or its loss).
 */
import type { Answer, ContractCaller } from "./caller.js";
import { takeToken, withSlot } from "./budget.js";
import { AmbiguousCreate, ContractCallError, ContractMismatch, JobStopped, NotSent, PollBudgetExceeded } from "./errors.js";
import { fingerprint } from "./fingerprint.js";

/** The contract this package was built for (2: migration 161's `open_create`). */
export const CONTRACT_VERSION = 2;

/** At start: fail with one line unless the database has this contract (or newer). */
export async function checkContract(caller: ContractCaller): Promise<number> {
  let have: number;
  try {
    have = Number(await caller.call("contract_version", {}));
  } catch (e) {
    const why = e instanceof Error ? e.message.split("\n")[0] : String(e);
    throw new ContractMismatch(`the app's database has no recon_dagster contract functions (${why}): run \`recon-dagster migrate\``);
  }
  if (!(have >= CONTRACT_VERSION)) {
    throw new ContractMismatch(`the app's database has contract version ${have}, this worker needs ${CONTRACT_VERSION}: run \`recon-dagster migrate\``);
  }
  return have;
}

function stop(jobId: string, a: Answer): never {
  const reason = a.reason === "job_not_found" ? "job_not_found" : "job_not_in_flight";
  throw new JobStopped(jobId, reason, (a.status as string | undefined) ?? null, String(a.message ?? reason));
}

function fixCall(fn: string, a: Answer): Answer {
  if (a.next === "fix_call") throw new ContractCallError(String(a.reason), `recon.${fn}: ${a.message ?? a.reason}`);
  return a;
}

/** A sync call, right before it: records its kind and start (never the status). Throws `JobStopped`. */
export async function markSyncCall(caller: ContractCaller, jobId: string, kind: string): Promise<void> {
  const a = fixCall("mark_call_start", await caller.call("mark_call_start", { job: jobId, kind }));
  if (a.next !== "call") stop(jobId, a);
}

/** Whether a create that threw may have made a task: default yes, unless it is certainly a
 * refusal (an error the app marks `refused`, `NotSent`, or an HTTP status 400-499 but 408/429). */
export function createMayExist(error: unknown): boolean {
  if (error instanceof NotSent) return false;
  if (error !== null && typeof error === "object") {
    const e = error as { refused?: unknown; status?: unknown };
    if (e.refused === true) return false;
    if (e.refused === false) return true;
    const status = Number(e.status);
    if (status >= 400 && status < 500 && status !== 408 && status !== 429) return false;
  }
  return true;
}

export interface RunOrResume<R> {
  jobId: string;
  /** recon_dagster's kind (`kie-standard`, `replicate-prediction`, ...). */
  kind: string;
  /** recon_dagster's provider name (`kie`, `replicate`, ...). */
  provider: string;
  /** The app's create; put `marker` where the provider echoes it (callback URL's `recon_create`). */
  create(marker: string): Promise<{ taskId: string }>;
  /** The app's poll of a task to its end (resumed tasks come here too, with the row's kind). */
  poll(taskId: string, kind: string): Promise<R>;
  /** What the create asks for (its fingerprint goes to the ledger); omit if unknown. */
  payload?: unknown;
  /** False when the request has no place for the marker. */
  markerSent?: boolean;
  /** The account whose create budget the create draws on (`kie`, ...); omit for none. */
  account?: string;
  /** Bound on waiting for the create token / slot (seconds). */
  maxWaitS?: number;
  /** Overrides `createMayExist`. */
  mayExist?(error: unknown): boolean;
}

export interface Outcome<R> {
  /** `created`: this attempt's task; `resumed`: the task the row already named (or another attempt's). */
  how: "created" | "resumed";
  taskId: string;
  kind: string;
  result: R;
}

/**
 * The async create of spec section 5.3 with the contract: resume the row's task, else (if no
 * create of the job may still exist) record the intent, create, record the answer, poll.
 */
export async function runOrResume<R>(caller: ContractCaller, o: RunOrResume<R>): Promise<Outcome<R>> {
  const point = fixCall("resume_point", await caller.call("resume_point", { job: o.jobId }));
  if (point.next === "stop") stop(o.jobId, point);
  if (point.next === "resume") {
    const kind = (point.kind as string | null) ?? o.kind;
    const taskId = String(point.task_id);
    return { how: "resumed", taskId, kind, result: await o.poll(taskId, kind) };
  }
  const open = fixCall("open_create", await caller.call("open_create", { job: o.jobId }));
  if (open.next !== "create") {
    throw new AmbiguousCreate(o.jobId, String(open.create_id), String(open.message));
  }
  const send = async () => {
    if (o.account !== undefined) await takeToken(caller, o.account, "create", o.maxWaitS ?? 30);
    const intent = fixCall("create_intent", await caller.call("create_intent", {
      job: o.jobId, provider: o.provider, kind: o.kind,
      fingerprint: o.payload === undefined ? "" : fingerprint(o.payload), marker_sent: o.markerSent ?? true,
    }));
    const createId = String(intent.create_id);
    let taskId: string;
    try {
      ({ taskId } = await o.create(String(intent.marker)));
    } catch (e) {
      const ambiguous = (o.mayExist ?? createMayExist)(e);
      await caller.call("create_lost", { create: createId, state: ambiguous ? "ambiguous" : "refused", detail: String(e).slice(0, 2000) });
      if (ambiguous) {
        throw new AmbiguousCreate(o.jobId, createId, `job ${o.jobId}: create ${intent.seq} lost its answer (${String(e).split("\n")[0]}); a task may exist, not creating again until the orphan sweep has looked`, e);
      }
      throw e;
    }
    return { createId, taskId };
  };
  const { createId, taskId } = o.account !== undefined ? await withSlot(caller, o.account, o.kind, send, { maxWaitS: o.maxWaitS ?? 30 }) : await send();
  const answered = fixCall("create_answered", await caller.call("create_answered", {
    job: o.jobId, provider: o.provider, kind: o.kind, task_id: taskId, create: createId,
  }));
  if (answered.next === "stop") stop(o.jobId, answered); // the job ended meanwhile: the sweep cancels the task
  if (answered.next === "resume") {
    const other = String(answered.task_id); // another attempt's task is the job's; ours is an orphan
    return { how: "resumed", taskId: other, kind: o.kind, result: await o.poll(other, o.kind) };
  }
  return { how: "created", taskId, kind: o.kind, result: await o.poll(taskId, o.kind) };
}

export interface PollLoop<T> {
  /** One poll: the result when the task ended, else undefined. */
  once(): Promise<T | undefined>;
  everyMs: number;
  maxAttempts: number;
  taskId: string;
  /** Before each poll (e.g. `() => takeToken(caller, "kie", "read")`). */
  before?(): Promise<unknown>;
}

/** Poll until `once` answers, at most `maxAttempts` times; else `PollBudgetExceeded` (resumable). */
export async function pollLoop<T>(p: PollLoop<T>): Promise<T> {
  for (let i = 1; i <= p.maxAttempts; i++) {
    if (p.before) await p.before();
    const got = await p.once();
    if (got !== undefined) return got;
    if (i < p.maxAttempts) await new Promise((r) => setTimeout(r, p.everyMs));
  }
  throw new PollBudgetExceeded(p.taskId, p.maxAttempts);
}
