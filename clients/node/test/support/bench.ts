/**
 * The package's overhead per job, beside a bare handler: database round trips and milliseconds.
 * The provider is in-process and instant (its own cost is the app's either way), the database
 * real (a fresh one, migrated). `npm run bench` (BENCH_JOBS, default 200). Prints figures only.
 */
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { pgCaller, runOrResume, type ContractCaller } from "../../src/index.js";
import { createDb } from "./db.js";

const N = Number(process.env.BENCH_JOBS ?? 200);
const db = await createDb("recon_node_bench");
try {
  let trips = 0;
  const counted: ContractCaller = (() => {
    const real = pgCaller(db.pool);
    return { call: (fn, args) => { trips++; return real.call(fn, args); } };
  })();
  const jobs = async () => {
    const ids = Array.from({ length: N }, () => randomUUID());
    await db.pool.query("INSERT INTO jobs (id, user_id, job_type, status) SELECT unnest($1::uuid[]), gen_random_uuid(), 'image', 'processing'", [ids]);
    return ids;
  };
  const provider = { create: async () => ({ taskId: randomUUID() }), poll: async (taskId: string) => ({ taskId }) };
  const payload = { model: "google/nano-banana-pro", input: { prompt: "a cat" } };

  // The bare handler: the spec's 5.2 callback written by hand (one UPDATE), no ledger, no resume.
  const bareIds = await jobs();
  let t = performance.now();
  for (const jobId of bareIds) {
    const { taskId } = await provider.create();
    await db.pool.query("UPDATE jobs SET provider_kind = $2, provider_task_id = $3, provider_call_started_at = now() WHERE id = $1", [jobId, "kie-standard", taskId]);
    trips++;
    await provider.poll(taskId);
  }
  const bare = { ms: (performance.now() - t) / N, trips: trips / N };

  const ids = await jobs();
  trips = 0;
  t = performance.now();
  for (const jobId of ids) {
    await runOrResume(counted, { jobId, kind: "kie-standard", provider: "kie", payload, create: provider.create, poll: provider.poll });
  }
  const created = { ms: (performance.now() - t) / N, trips: trips / N };

  trips = 0;
  t = performance.now();
  for (const jobId of ids) {
    await runOrResume(counted, { jobId, kind: "kie-standard", provider: "kie", payload, create: provider.create, poll: provider.poll });
  }
  const resumed = { ms: (performance.now() - t) / N, trips: trips / N };

  const row = (name: string, r: { ms: number; trips: number }) =>
    console.log(`${name.padEnd(42)} ${r.trips.toFixed(1).padStart(6)} round trips  ${r.ms.toFixed(2).padStart(7)} ms/job`);
  console.log(`${N} jobs, PostgreSQL ${db.url.replace(/\/\/[^@]*@/, "//").replace(/\/[^/]*$/, "")}, instant in-process provider`);
  row("bare handler (5.2's UPDATE by hand)", bare);
  row("runOrResume, a create", created);
  row("runOrResume, a stall-retry (resume)", resumed);
  console.log(`overhead of a create: +${(created.trips - bare.trips).toFixed(1)} round trips, +${(created.ms - bare.ms).toFixed(2)} ms/job`);
} finally {
  await db.drop();
}
