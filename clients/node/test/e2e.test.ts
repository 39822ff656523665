/**
 * The design's incident, end to end: a real BullMQ queue on the machine's Redis, worker processes
 * running the spec-5.3 handler with this package, the loopback provider sandbox over HTTP, real
 * PostgreSQL. Each case counts the creates that reached the sandbox and the charges in the
 * database. Redis, Node, the sandbox and PostgreSQL missing make these fail, never skip.
 */
import { after, afterEach, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import type { Queue } from "bullmq";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { createDb, tool, REPO, type TestDb } from "./support/db.js";
import { admin, createsAt, newQueue, startSandbox, startWorker, until, type Sandbox, type WorkerProcess, REDIS_PORT } from "./support/world.js";

let db: TestDb;
let sb: Sandbox;
let q: { queue: Queue; name: string; prefix: string };
const workers: WorkerProcess[] = [];

before(async () => {
  [db, sb] = await Promise.all([createDb("recon_node_e2e"), startSandbox()]);
  q = newQueue();
});
after(async () => {
  for (const w of workers) if (w.child.exitCode === null && w.child.signalCode === null) w.child.kill("SIGKILL");
  await q?.queue.obliterate({ force: true }).catch(() => undefined);
  await q?.queue.close();
  sb?.stop();
  await db?.drop();
});

// A case that fails leaves no worker behind to take the next case's job (each case's own end
// stops its workers only when it passes).
afterEach(async () => {
  const alive = workers.filter((w) => w.child.exitCode === null && w.child.signalCode === null);
  for (const w of alive) w.child.kill("SIGKILL");
  await Promise.all(alive.map((w) => w.exited));
});

function worker(extra: Record<string, string> = {}): WorkerProcess {
  const w = startWorker({
    DATABASE_URL: db.url, KIE_URL: sb.env.KIE_BASE_URL ?? `${sb.base}/kie`, KIE_KEY: sb.env.KIE_API_KEY ?? "sandbox-key",
    REPLICATE_URL: sb.env.REPLICATE_BASE_URL ?? `${sb.base}/replicate/v1`, REPLICATE_KEY: sb.env.REPLICATE_API_TOKEN ?? "sandbox-key",
    QUEUE: q.name, PREFIX: q.prefix, REDIS_PORT: String(REDIS_PORT), ...extra,
  });
  workers.push(w);
  return w;
}

/** A `jobs` row in flight with its credits reserved, as the app's route leaves it. */
async function appJob(): Promise<string> {
  const id = randomUUID();
  const user = randomUUID();
  await db.pool.query("INSERT INTO jobs (id, user_id, job_type, status, started_at) VALUES ($1, $2, 'image', 'processing', now())", [id, user]);
  await db.pool.query("INSERT INTO usage_logs (job_id, user_id, status, amount) VALUES ($1, $2, 'reserved', 10)", [id, user]);
  return id;
}

async function settled(jobId: string) {
  const { rows: [job] } = await db.pool.query("SELECT status, provider_task_id FROM jobs WHERE id = $1", [jobId]);
  const { rows: logs } = await db.pool.query("SELECT status FROM usage_logs WHERE job_id = $1", [jobId]);
  const { rows: creates } = await db.pool.query("SELECT seq, state, task_id FROM upstream_creates WHERE job_id = $1 ORDER BY seq", [jobId]);
  return { status: job.status as string, taskId: job.provider_task_id as string | null, charges: logs.filter((l) => l.status === "committed").length, creates };
}

/** `recon-dagster <args>` against the test's database and the sandbox (its provider env). */
async function reconDagster(...args: string[]): Promise<string> {
  return reconDagsterEnv({}, ...args);
}

/** `recon-dagster <args>` with settings of its own (`{ RECON_X: "..." }`). */
async function reconDagsterEnv(own: Record<string, string>, ...args: string[]): Promise<string> {
  const { stdout } = await promisify(execFile)(tool("recon-dagster"), args, {
    // RECON_ORPHAN_GRACE_S=0: the sweep's grace for a fresh task is time passing, not a rule
    cwd: REPO, env: { ...process.env, ...sb.env, RECON_DATABASE_URL: db.url, RECON_ORPHAN_GRACE_S: "0", ...own },
  });
  return stdout;
}

/** A KIE job in flight for hours whose task the sandbox holds (`scenario`): due for the reconciler. */
async function staleKieJob(scenario: Record<string, unknown>): Promise<{ jobId: string; taskId: string }> {
  const { task_id: taskId } = await admin<{ task_id: string }>(sb, "tasks", { method: "POST", body: JSON.stringify({ kind: "kie-standard", scenario }) });
  const jobId = randomUUID();
  const user = randomUUID();
  await db.pool.query(
    `INSERT INTO jobs (id, user_id, job_type, status, provider_kind, provider_task_id, started_at, provider_call_started_at, created_at, updated_at)
     VALUES ($1, $2, 'image', 'processing', 'kie-standard', $3, now() - interval '3 hours', now() - interval '3 hours', now() - interval '3 hours', now() - interval '3 hours')`,
    [jobId, user, taskId],
  );
  await db.pool.query("INSERT INTO usage_logs (job_id, user_id, status, amount) VALUES ($1, $2, 'reserved', 10)", [jobId, user]);
  return { jobId, taskId };
}

/** Seconds the `kie` account is still blocked by a provider's Retry-After (0: not). */
async function kieBlockedS(): Promise<number> {
  const { rows } = await db.pool.query("SELECT greatest(0, extract(epoch FROM blocked_until - now()))::float8 AS s FROM provider_limit_accounts WHERE account = 'kie'");
  return Number(rows[0]?.s ?? 0);
}

/** The block over (as if its time passed): the account's buckets full again. */
async function unblockKie(): Promise<void> {
  await db.pool.query("UPDATE provider_limit_accounts SET blocked_until = now() - interval '1 second' WHERE account = 'kie'");
  await db.pool.query("UPDATE provider_limit_buckets SET tokens = burst, stamp = clock_timestamp() WHERE account = 'kie'");
}

async function bullState(jobId: string) {
  return (await q.queue.getJob(jobId))?.getState();
}

describe("a BullMQ worker running the spec-5.3 handler with the package", () => {
  it("killed mid-poll: the stalled check re-runs the job, the retry resumes the same task; one create, charged once", async () => {
    const jobId = await appJob();
    const a = worker();
    await a.next((e) => e.event === "ready");
    await q.queue.add("generate", { jobId, prompt: "a cat", scenario: { polls_before_done: 15 } }, { jobId, attempts: 3 });
    const polling = await a.next((e) => e.event === "polling" && e.jobId === jobId && e.attempt >= 2);
    a.child.kill("SIGKILL"); // the worker recycled mid-poll
    await a.exited;
    assert.equal((await settled(jobId)).status, "processing");

    const b = worker();
    const done = await b.next((e) => e.event === "done" && e.jobId === jobId);
    await until(async () => (await bullState(jobId)) === "completed", "the BullMQ job to complete");

    assert.equal(done.how, "resumed");
    assert.equal(done.taskId, polling.taskId);
    assert.equal(await createsAt(sb, jobId), 1);
    const s = await settled(jobId);
    assert.equal(s.status, "completed");
    assert.equal(s.charges, 1);
    assert.deepEqual(s.creates, [{ seq: 1, state: "created", task_id: polling.taskId }]);
    b.child.kill("SIGTERM");
    await b.exited;
  });

  it("a poll longer than the lock: two workers hold the job at once; one create, one charge", async () => {
    const jobId = await appJob();
    // a's lock is never renewed (renewal slower than the lock): mid-create, the stalled check hands
    // the job to b while a still runs, the design's double-billing case.
    const a = worker({ E2E_LOCK_MS: "1000", E2E_LOCK_RENEW_MS: "600000", E2E_STALLED_MS: "500", E2E_MAX_STALLED: "5" });
    await a.next((e) => e.event === "ready");
    await q.queue.add("generate", { jobId, prompt: "a dog", scenario: { latency_s: 2.5, polls_before_done: 2 } }, { jobId, attempts: 5, backoff: { type: "fixed", delay: 3000 } });
    await a.next((e) => e.event === "start" && e.jobId === jobId);
    const b = worker({ E2E_STALLED_MS: "500" });
    const bStart = await b.next((e) => e.event === "start" && e.jobId === jobId);
    const aDone = await a.next((e) => (e.event === "done" || e.event === "error") && e.jobId === jobId);
    const bEnd = await b.next((e) => e.jobId === jobId && ["done", "error", "stopped"].includes(e.event) && e !== bStart);

    assert.equal(aDone.event, "done", JSON.stringify(aDone));
    // b ran while a held the job: a's create in flight, b refused to create a second; or (on a
    // slow machine b starts later) a's task already on the row, b resumed it. Never a create of b's.
    if (bEnd.event === "error") assert.equal(bEnd.name, "AmbiguousCreate", JSON.stringify(bEnd));
    else assert.deepEqual([bEnd.event, bEnd.how, bEnd.taskId], ["done", "resumed", aDone.taskId], JSON.stringify(bEnd));
    await until(async () => (await settled(jobId)).status === "completed", "the job to complete");
    assert.equal(await createsAt(sb, jobId), 1);
    const s = await settled(jobId);
    assert.equal(s.charges, 1);
    assert.equal(s.creates.length, 1);
    for (const w of [a, b]) w.child.kill("SIGTERM");
    await Promise.all([a.exited, b.exited]);
  });

  it("killed and never retried (maxStalledCount reached): the reconciler recovers the row from its task id", async () => {
    const jobId = await appJob();
    const a = worker({ E2E_MAX_STALLED: "0" });
    await a.next((e) => e.event === "ready");
    await q.queue.add("generate", { jobId, prompt: "a bird", scenario: { polls_before_done: 3 } }, { jobId, attempts: 3 });
    const polling = await a.next((e) => e.event === "polling" && e.jobId === jobId);
    a.child.kill("SIGKILL");
    await a.exited;
    const b = worker({ E2E_MAX_STALLED: "0" }); // its stalled check fails the job for good
    await until(async () => (await bullState(jobId)) === "failed", "BullMQ to give the stalled job up");
    assert.equal(b.events.filter((e) => e.event === "start" && e.jobId === jobId).length, 0);
    const stuck = await settled(jobId);
    assert.equal(stuck.status, "processing");
    assert.equal(stuck.taskId, polling.taskId);

    // Hours pass (the kind's stale threshold): nobody writes the row meanwhile.
    await db.pool.query(
      "UPDATE jobs SET started_at = started_at - interval '3 hours', provider_call_started_at = provider_call_started_at - interval '3 hours', created_at = created_at - interval '3 hours', updated_at = updated_at - interval '3 hours' WHERE id = $1",
      [jobId],
    );
    await until(async () => {
      // due now (the task is still running upstream after a tick; the next tick comes at once)
      await reconDagster("retry", jobId, "--reason", "node e2e: the next tick now");
      await reconDagster("reconcile", "--once", "--no-sweep");
      return (await settled(jobId)).status !== "processing";
    }, "the reconciler to settle the job", 180_000).catch(async (e) => { console.log(await reconDagster("explain", jobId)); throw e; });
    const s = await settled(jobId);
    assert.equal(s.status, "completed");
    assert.equal(s.charges, 1);
    assert.equal(await createsAt(sb, jobId), 1);
    b.child.kill("SIGTERM");
    await b.exited;
  });

  it("killed after Replicate accepted the create, before its answer was recorded: no second create; the sweep calls the task probably_ours, the operator adopts it, the reconciler completes, charged once", async () => {
    const jobId = await appJob();
    const a = worker({ E2E_DIE: "after_create" });
    await a.next((e) => e.event === "ready");
    await q.queue.add("generate", { jobId, prompt: "a fox", provider: "replicate", scenario: { polls_before_done: 0 } }, { jobId, attempts: 2, backoff: { type: "fixed", delay: 600_000 } });
    const created = await a.next((e) => e.event === "created" || e.event === "error");
    assert.equal(created.event, "created", JSON.stringify(created));
    await a.exited;
    const b = worker(); // BullMQ's stalled check hands the job to b
    const refused = await b.next((e) => e.jobId === jobId && e.event === "error");
    assert.equal(refused.name, "AmbiguousCreate", JSON.stringify(refused));
    assert.equal(await createsAt(sb, jobId), 1);
    const stuck = await settled(jobId);
    assert.equal(stuck.taskId, null);
    assert.deepEqual(stuck.creates.map((c) => c.state), ["sending"]);

    // Replicate's list carries no webhook, so no marker proof: the task only resembles the lost
    // create (issue 46) and is never adopted on that; the operator's word adopts it.
    const report = JSON.parse(await reconDagster("orphans", "--act", "--json")) as { tasks: { task_id: string; action: string }[] };
    assert.equal(report.tasks.find((t) => t.task_id === created.taskId)?.action, "probably_ours", JSON.stringify(report.tasks));
    assert.equal((await settled(jobId)).taskId, null);
    await reconDagster("orphans", "--adopt", String(created.taskId), "--job", jobId, "--reason", "node e2e: killed mid-create, our prompt");
    assert.equal((await settled(jobId)).taskId, created.taskId);
    await db.pool.query(
      "UPDATE jobs SET started_at = started_at - interval '3 hours', provider_call_started_at = provider_call_started_at - interval '3 hours', created_at = created_at - interval '3 hours', updated_at = updated_at - interval '3 hours' WHERE id = $1",
      [jobId],
    );
    let round = 0;
    await until(async () => {
      // the adopted job is stale, so due at once; a later round asks the next tick now
      if (round++ > 0) await reconDagster("retry", jobId, "--reason", "node e2e: the next tick now");
      await reconDagster("reconcile", "--once", "--no-sweep");
      return (await settled(jobId)).status !== "processing";
    }, "the reconciler to settle the job", 180_000).catch(async (e) => { console.log(await reconDagster("explain", jobId)); throw e; });
    const s = await settled(jobId);
    assert.equal(s.status, "completed");
    assert.equal(s.charges, 1);
    assert.equal(await createsAt(sb, jobId), 1);
    b.child.kill("SIGTERM");
    await b.exited;
  });

  it("a 429 with Retry-After heard by the reconciler holds back a Node worker's requests to the account, and one heard by a Node worker holds back the reconciler's polls", async () => {
    // A short poll deadline and lease: a reconcile poll does not wait out a 100 s block, it is
    // not sent (as a Node request whose bound the block outlasts); the case never waits the block out.
    const quick = { RECON_POLL_DEADLINE_S: "5", RECON_LEASE_S: "20" };
    // A run whose polls got no answer exits 1 ("kie outage"): expected here, the rows say the rest.
    const reconcile = () => reconDagsterEnv(quick, "reconcile", "--once", "--no-sweep").catch((e: { code?: number; stdout?: string }) => {
      if (e.code !== 1) throw e;
      return e.stdout ?? "";
    });
    try {
      // The reconciler hears it: its poll answered 429, Retry-After 100.
      const throttled = await staleKieJob({ rate_limit_first: 1, retry_after_s: 100, polls_before_done: 0 });
      await reconcile();
      assert.ok((await kieBlockedS()) > 60, "the reconciler shared the provider's Retry-After");
      const w = worker({ E2E_ACCOUNT: "kie" });
      const jobId = await appJob();
      await q.queue.add("generate", { jobId, prompt: "a heron", scenario: { polls_before_done: 0 } }, { jobId, attempts: 1 });
      const held = await w.next((e) => e.jobId === jobId && (e.event === "error" || e.event === "done"));
      assert.equal(held.name, "NotSent", JSON.stringify(held)); // blocked past its 30 s bound: not sent
      assert.equal(await createsAt(sb, jobId), 0);
      await unblockKie();

      // The Node worker hears it: its poll answered 429, Retry-After 100.
      const nodeJob = await appJob();
      await q.queue.add("generate", { jobId: nodeJob, prompt: "a crane", scenario: { rate_limit_first: 1, retry_after_s: 100, polls_before_done: 0 } }, { jobId: nodeJob, attempts: 1 });
      await w.next((e) => e.event === "retry_after" && e.seconds === 100);
      assert.ok((await kieBlockedS()) > 60, "the worker shared the provider's Retry-After");
      const due = await staleKieJob({ polls_before_done: 0 });
      await reconcile();
      const info = await admin<{ requests: number }>(sb, `tasks/${due.taskId}`);
      assert.equal(info.requests, 0, "the reconciler polled an account the worker heard throttled");
      assert.equal((await settled(due.jobId)).status, "processing");
      const { rows } = await db.pool.query("SELECT outcome, detail FROM reconcile_events WHERE job_id = $1", [due.jobId]);
      assert.deepEqual(rows.map((r) => r.outcome), ["not_sent"], JSON.stringify(rows));
      assert.match(String(rows[0].detail), /^limiter_refused/);
      assert.equal((await settled(throttled.jobId)).status, "processing");
      w.child.kill("SIGTERM");
      await w.exited;
    } finally {
      await unblockKie(); // the other cases poll this account too
    }
  });
});
