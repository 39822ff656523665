/**
 * A BullMQ worker process as the app runs one: the handler of spec section 5.3 (resume the
 * row's task, else create it with its task id persisted at once), written with this package
 * around the app's own KIE client (createKieTask / pollKieTask, plain fetch). Forked by the
 * end-to-end tests; it reports what it does over IPC so the test can kill it at the right moment.
 *
 * Test-only knobs (env): E2E_DIE=after_create kills the process (SIGKILL) after KIE accepted the
 * create and before its answer is recorded; E2E_SKIP=resume_point,open_create makes the package
 * skip those steps (the caller answers "create" for them) to show the cases fail without them.
 */
import { Worker, type Job } from "bullmq";
import pg from "pg";
import {
  JobStopped, parseRetryAfter, pgCaller, pollLoop, recordRetryAfter, runOrResume, takeToken, checkContract,
  type ContractCaller,
} from "../../src/index.js";

const env = (name: string, fallback?: string): string => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
};

const pool = new pg.Pool({ connectionString: env("DATABASE_URL"), max: 4 });
const skip = new Set(env("E2E_SKIP", "").split(",").filter(Boolean));
const real = pgCaller(pool);
const caller: ContractCaller = {
  call: (fn, args) => (skip.has(fn) ? Promise.resolve({ next: "create" }) : real.call(fn, args)),
};
const KIE = env("KIE_URL");
const KEY = env("KIE_KEY");
const ACCOUNT = process.env.E2E_ACCOUNT || undefined; // the shared budget's account ("kie")
const tell = (m: Record<string, unknown>) => process.send?.({ pid: process.pid, ...m });

class KieError extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

/** The app's own KIE client: create. */
async function createKieTask(body: Record<string, unknown>, marker: string): Promise<{ taskId: string }> {
  const res = await fetch(`${KIE}/api/v1/jobs/createTask`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ ...body, callBackUrl: `http://127.0.0.1:9/kie-hook?recon_create=${marker}` }),
  });
  const answer = (await res.json()) as { code: number; msg?: string; data?: { taskId?: string } };
  if (!res.ok || answer.code !== 200 || !answer.data?.taskId) throw new KieError(answer.code || res.status, `KIE create: ${answer.msg}`);
  tell({ event: "created", taskId: answer.data.taskId });
  if (process.env.E2E_DIE === "after_create") process.kill(process.pid, "SIGKILL");
  return { taskId: answer.data.taskId };
}

const REP = env("REPLICATE_URL", "");
const REP_KEY = env("REPLICATE_KEY", "");

/** The app's own Replicate client: create (the marker rides on the webhook URL). */
async function createPrediction(body: Record<string, unknown>, marker: string): Promise<{ taskId: string }> {
  const res = await fetch(`${REP}/predictions`, {
    method: "POST",
    headers: { authorization: `Bearer ${REP_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ ...body, webhook: `http://127.0.0.1:9/rep-hook?recon_create=${marker}` }),
  });
  const answer = (await res.json()) as { id?: string; detail?: string };
  if (!res.ok || !answer.id) throw new KieError(res.status, `Replicate create: ${answer.detail}`);
  tell({ event: "created", taskId: answer.id });
  if (process.env.E2E_DIE === "after_create") process.kill(process.pid, "SIGKILL");
  return { taskId: answer.id };
}

function pollPrediction(jobId: string, taskId: string): Promise<Record<string, unknown>> {
  let attempt = 0;
  return pollLoop({
    taskId, everyMs: Number(env("E2E_POLL_EVERY_MS", "200")), maxAttempts: Number(env("E2E_POLL_MAX", "200")),
    once: async () => {
      tell({ event: "polling", jobId, taskId, attempt: ++attempt });
      const res = await fetch(`${REP}/predictions/${encodeURIComponent(taskId)}`, { headers: { authorization: `Bearer ${REP_KEY}` } });
      const p = (await res.json()) as { status?: string; output?: unknown; error?: string };
      if (p.status === "succeeded") return { taskId, output: p.output };
      if (p.status === "failed" || p.status === "canceled") throw new KieError(500, `prediction ${taskId} ${p.status}: ${p.error}`);
      return undefined;
    },
  });
}

/** The app's own KIE client: poll to the end, each poll under the account's read budget. */
function pollKieTask(jobId: string, taskId: string): Promise<Record<string, unknown>> {
  let attempt = 0;
  return pollLoop({
    taskId,
    everyMs: Number(env("E2E_POLL_EVERY_MS", "200")),
    maxAttempts: Number(env("E2E_POLL_MAX", "200")),
    before: async () => {
      if (ACCOUNT) await takeToken(caller, ACCOUNT, "read", 30);
    },
    once: async () => {
      tell({ event: "polling", jobId, taskId, attempt: ++attempt });
      const res = await fetch(`${KIE}/api/v1/jobs/recordInfo?taskId=${encodeURIComponent(taskId)}`, { headers: { authorization: `Bearer ${KEY}` } });
      if (res.status === 429) {
        const s = parseRetryAfter(res.headers.get("retry-after")) ?? 1;
        if (ACCOUNT) await recordRetryAfter(caller, ACCOUNT, s);
        tell({ event: "retry_after", seconds: s });
        return undefined;
      }
      const answer = (await res.json()) as { code: number; data?: { state?: string; resultJson?: string; failMsg?: string } };
      if (answer.data?.state === "success") return { taskId, resultJson: answer.data.resultJson };
      if (answer.data?.state === "fail") throw new KieError(500, `KIE task ${taskId} failed: ${answer.data.failMsg}`);
      return undefined;
    },
  });
}

/** Spec 5.4, step 4-5: the CAS-guarded completion and the credit commit, in one statement. */
async function finalizeJobWithMedia(jobId: string, result: Record<string, unknown>): Promise<boolean> {
  const { rows } = await pool.query(
    `WITH done AS (
       UPDATE jobs SET status = 'completed', output_data = $2, completed_at = now(), updated_at = now(), progress = 100
       WHERE id = $1 AND status IN ('pending', 'processing') RETURNING id)
     UPDATE usage_logs SET status = 'committed', settled_at = now()
     WHERE job_id IN (SELECT id FROM done) AND status = 'reserved' RETURNING id`,
    [jobId, JSON.stringify(result)],
  );
  return rows.length > 0;
}

/** The handler: spec 5.3's retry guard, with the contract. */
async function handleGenerateImage(job: Job<{ jobId: string; prompt: string; scenario?: Record<string, unknown>; provider?: string }>) {
  const { jobId, prompt, scenario } = job.data;
  if (job.data.provider === "replicate") {
    const body = { version: "sandbox-v1", input: { prompt }, sandbox_scenario: scenario };
    tell({ event: "start", jobId, attempt: job.attemptsMade });
    try {
      const out = await runOrResume(caller, {
        jobId, kind: "replicate-prediction", provider: "replicate", payload: body,
        create: (marker) => createPrediction(body, marker),
        poll: (taskId) => pollPrediction(jobId, taskId),
      });
      const finalized = await finalizeJobWithMedia(jobId, out.result);
      tell({ event: "done", jobId, how: out.how, taskId: out.taskId, finalized });
      return { how: out.how, taskId: out.taskId, finalized };
    } catch (e) {
      tell({ event: "error", jobId, name: (e as Error).name, message: (e as Error).message });
      throw e;
    }
  }
  const body = { model: "google/nano-banana-pro", input: { prompt }, sandbox_scenario: scenario };
  tell({ event: "start", jobId, attempt: job.attemptsMade });
  try {
    const out = await runOrResume(caller, {
      jobId, kind: "kie-standard", provider: "kie", payload: body, account: ACCOUNT,
      create: (marker) => createKieTask(body, marker),
      poll: (taskId) => pollKieTask(jobId, taskId),
    });
    const finalized = await finalizeJobWithMedia(jobId, out.result);
    tell({ event: "done", jobId, how: out.how, taskId: out.taskId, finalized });
    return { how: out.how, taskId: out.taskId, finalized };
  } catch (e) {
    if (e instanceof JobStopped) {
      tell({ event: "stopped", jobId, reason: e.reason });
      return { how: "stopped", reason: e.reason };
    }
    tell({ event: "error", jobId, name: (e as Error).name, message: (e as Error).message });
    throw e;
  }
}

await checkContract(real);
const worker = new Worker(env("QUEUE"), handleGenerateImage, {
  connection: { host: "127.0.0.1", port: Number(env("REDIS_PORT", "6379")), maxRetriesPerRequest: null },
  prefix: env("PREFIX"),
  concurrency: 1,
  lockDuration: Number(env("E2E_LOCK_MS", "1500")),
  lockRenewTime: Number(env("E2E_LOCK_RENEW_MS", "500")),
  stalledInterval: Number(env("E2E_STALLED_MS", "1000")),
  maxStalledCount: Number(env("E2E_MAX_STALLED", "1")),
  autorun: true,
});
worker.on("ready", () => tell({ event: "ready" }));
const shutdown = async () => {
  await worker.close();
  await pool.end();
  process.exit(0);
};
process.on("SIGTERM", () => void shutdown());
process.on("disconnect", () => void shutdown());
