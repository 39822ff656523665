/** Plays contract/scenarios.json (format: contract/README.md) through a `ContractCaller`. */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { randomUUID } from "node:crypto";
import type pg from "pg";
import type { ContractCaller } from "../../src/index.js";
import { fingerprint } from "../../src/index.js";
import { REPO } from "./db.js";

export interface Scenario {
  name: string;
  given?: { jobs?: Record<string, { status: string; job_type: string }>; accounts?: Record<string, { buckets?: Record<string, { rate_per_s: number; burst: number }>; slots?: number }> };
  steps: Array<Record<string, any>>;
  rows?: Record<string, any>;
}

export function load(): Scenario[] {
  return JSON.parse(readFileSync(join(REPO, "contract", "scenarios.json"), "utf8")).scenarios;
}

export function fill(value: any, names: Record<string, any>): any {
  if (typeof value === "string") {
    if (value.startsWith("{") && value.endsWith("}") && value.slice(1, -1) in names) return names[value.slice(1, -1)];
    for (const [k, v] of Object.entries(names)) value = value.split("{" + k + "}").join(String(v));
    return value;
  }
  if (Array.isArray(value)) return value.map((v) => fill(v, names));
  if (value !== null && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fill(v, names)]));
  return value;
}

async function given(pool: pg.Pool, spec: Scenario["given"] = {}): Promise<Record<string, any>> {
  const names: Record<string, any> = {};
  const user = randomUUID();
  for (const [ref, job] of Object.entries(spec.jobs ?? {})) {
    const id = randomUUID();
    await pool.query("INSERT INTO jobs (id, user_id, job_type, status) VALUES ($1, $2, $3, $4)", [id, user, job.job_type, job.status]);
    names[ref] = id;
  }
  for (const [ref, account] of Object.entries(spec.accounts ?? {})) {
    const name = `${ref}-${randomUUID().replace(/-/g, "").slice(0, 12)}`;
    await pool.query("INSERT INTO provider_limit_accounts (account) VALUES ($1)", [name]);
    for (const [bucket, b] of Object.entries(account.buckets ?? {})) {
      await pool.query("INSERT INTO provider_limit_buckets (account, bucket, rate_per_s, burst, tokens) VALUES ($1, $2, $3, $4, $4)", [name, bucket, b.rate_per_s, b.burst]);
    }
    await pool.query("INSERT INTO provider_limit_slots (account, slot) SELECT $1, g FROM generate_series(0, $2::int - 1) g", [name, account.slots ?? 0]);
    names[ref] = name;
  }
  return names;
}

/** `callers(process)`: the caller of each process (`main` first). Returns every miss (empty: holds). */
export async function play(pool: pg.Pool, callerOf: (process: string) => ContractCaller, scenario: Scenario): Promise<string[]> {
  const refs = await given(pool, scenario.given);
  let saved: Record<string, any> = {};
  const misses: string[] = [];
  let caller = callerOf("main");
  for (const [i, step] of scenario.steps.entries()) {
    const names = { ...refs, ...saved };
    if ("call" in step) {
      const args: Record<string, any> = fill(step.args ?? {}, names);
      if ("payload" in args) {
        args.fingerprint = fingerprint(args.payload);
        delete args.payload;
      }
      const answer = await caller.call(step.call, args);
      for (const [key, want] of Object.entries(fill(step.expect ?? {}, names))) {
        if (!isDeepStrictEqual(answer[key], want)) misses.push(`step ${i} ${step.call}: ${key} is ${JSON.stringify(answer[key])}, expected ${JSON.stringify(want)}`);
      }
      for (const [v, key] of Object.entries(step.save ?? {})) saved[v] = answer[key as string];
    } else if ("crash" in step) {
      saved = {};
    } else if ("sweep" in step) {
      await pool.query("UPDATE jobs SET status = $1, updated_at = now() WHERE id = $2", [step.status, refs[step.sweep]]);
    } else if ("process" in step) {
      caller = callerOf(step.process);
    } else if (!("provider" in step)) {
      throw new Error(`step ${i} of ${scenario.name} is of no known kind`);
    }
  }
  return [...misses, ...(await checkRows(pool, fill(scenario.rows ?? {}, refs), refs))];
}

export async function checkRows(pool: pg.Pool, rows: Record<string, any>, refs: Record<string, any>): Promise<string[]> {
  const misses: string[] = [];
  for (const [ref, want] of Object.entries<Record<string, any>>(rows.jobs ?? {})) {
    const { rows: [got] } = await pool.query("SELECT status, provider_kind, provider_task_id, provider_call_started_at IS NOT NULL AS call_started FROM jobs WHERE id = $1", [refs[ref]]);
    for (const [k, v] of Object.entries(want)) if (!isDeepStrictEqual(got?.[k], v)) misses.push(`jobs[${ref}].${k} is ${JSON.stringify(got?.[k])}, expected ${JSON.stringify(v)}`);
  }
  for (const [ref, want] of Object.entries<Array<Record<string, any>>>(rows.upstream_creates ?? {})) {
    const { rows: got } = await pool.query("SELECT * FROM upstream_creates WHERE job_id = $1 ORDER BY seq", [refs[ref]]);
    if (got.length !== want.length) misses.push(`upstream_creates[${ref}]: ${got.length} rows, expected ${want.length}`);
    want.forEach((w, j) => {
      for (const [k, v] of Object.entries(w)) if (!isDeepStrictEqual(got[j]?.[k], v)) misses.push(`upstream_creates[${ref}] seq ${j + 1}: ${k} is ${JSON.stringify(got[j]?.[k])}, expected ${JSON.stringify(v)}`);
    });
  }
  for (const [ref, want] of Object.entries<string[]>(rows.credit_anomalies ?? {})) {
    const { rows: got } = await pool.query("SELECT reason FROM credit_anomalies WHERE job_id = $1", [refs[ref]]);
    const reasons = got.map((r) => r.reason as string).sort();
    if (!isDeepStrictEqual(reasons, [...want].sort())) misses.push(`credit_anomalies[${ref}] are ${JSON.stringify(reasons)}, expected ${JSON.stringify([...want].sort())}`);
  }
  for (const [ref, buckets] of Object.entries<Record<string, { tokens_at_most: number }>>(rows.buckets ?? {})) {
    for (const [bucket, want] of Object.entries(buckets)) {
      const { rows: [got] } = await pool.query("SELECT tokens FROM provider_limit_buckets WHERE account = $1 AND bucket = $2", [refs[ref], bucket]);
      if (!(Number(got?.tokens) <= want.tokens_at_most)) misses.push(`buckets[${ref}].${bucket} has ${got?.tokens} tokens, expected <= ${want.tokens_at_most}`);
    }
  }
  for (const [ref, want] of Object.entries<Record<string, any>>(rows.accounts ?? {})) {
    const { rows: [got] } = await pool.query("SELECT retry_afters, blocked_until > now() AS blocked FROM provider_limit_accounts WHERE account = $1", [refs[ref]]);
    for (const [k, v] of Object.entries(want)) if (!isDeepStrictEqual(got?.[k], v)) misses.push(`accounts[${ref}].${k} is ${JSON.stringify(got?.[k])}, expected ${JSON.stringify(v)}`);
  }
  for (const [ref, want] of Object.entries<{ held: number }>(rows.slots ?? {})) {
    const { rows: [got] } = await pool.query("SELECT count(*) AS held FROM provider_limit_slots WHERE account = $1 AND holder IS NOT NULL AND expires_at > clock_timestamp()", [refs[ref]]);
    if (Number(got?.held) !== want.held) misses.push(`slots[${ref}]: ${got?.held} held, expected ${want.held}`);
  }
  return misses;
}
