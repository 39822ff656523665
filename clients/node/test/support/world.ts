/**
 * What the end-to-end cases start: the loopback provider sandbox (`python -m recon_dagster.sandbox`
 * on a free port), a BullMQ queue of their own on the machine's Redis, and worker processes.
 */
import { fork, spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Queue } from "bullmq";
import { REPO, tool } from "./db.js";

export const REDIS_PORT = Number(process.env.RECON_REDIS_PORT ?? 6379);

export interface Sandbox {
  base: string;
  env: Record<string, string>;
  stop(): void;
}

export async function startSandbox(): Promise<Sandbox> {
  const child = spawn(tool("python"), ["-m", "recon_dagster.sandbox", "--port", "0"], { cwd: REPO, stdio: ["ignore", "pipe", "inherit"] });
  const env: Record<string, string> = {};
  const base = await new Promise<string>((resolve, reject) => {
    let buf = "";
    let url = "";
    child.once("exit", (code) => reject(new Error(`the sandbox exited (${code}) before it listened`)));
    child.stdout!.on("data", (chunk: Buffer) => {
      buf += chunk.toString();
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        const m = /listening on (\S+)/.exec(line);
        if (m) url = m[1]!;
        const kv = /^([A-Z0-9_]+)=(.*)$/.exec(line);
        if (kv) env[kv[1]!] = kv[2]!;
        if (url && kv && kv[1]!.startsWith("RECON_MEDIA")) resolve(url);
      }
      if (url && Object.keys(env).length > 3) setTimeout(() => resolve(url), 50);
    });
  });
  return { base, env, stop: () => child.kill("SIGTERM") };
}

export async function admin<T = any>(sb: Sandbox, path: string, init?: RequestInit): Promise<T> {
  const res = await fetch(`${sb.base}/_sandbox/${path}`, init);
  return (await res.json()) as T;
}

/** How many creates with `contains` in their body reached the sandbox. */
export async function createsAt(sb: Sandbox, contains: string): Promise<number> {
  return (await admin<{ count: number }>(sb, `creates?contains=${encodeURIComponent(contains)}`)).count;
}

export function newQueue(): { queue: Queue; name: string; prefix: string } {
  const name = `recon-node-e2e-${randomUUID().slice(0, 8)}`;
  const prefix = `recon-node-test`;
  const queue = new Queue(name, { connection: { host: "127.0.0.1", port: REDIS_PORT, maxRetriesPerRequest: 3 }, prefix });
  return { queue, name, prefix };
}

export interface WorkerProcess {
  child: ChildProcess;
  events: Array<Record<string, any>>;
  /** Resolves with the first event (so far or later) that `match` accepts. */
  next(match: (e: Record<string, any>) => boolean, boundMs?: number): Promise<Record<string, any>>;
  exited: Promise<number | null>;
}

const WORKER = join(dirname(fileURLToPath(import.meta.url)), "worker.js");

export function startWorker(env: Record<string, string>): WorkerProcess {
  const child = fork(WORKER, [], { env: { ...process.env, ...env }, stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const events: Array<Record<string, any>> = [];
  const waiters: Array<{ match: (e: Record<string, any>) => boolean; resolve: (e: Record<string, any>) => void }> = [];
  child.on("message", (m: any) => {
    events.push(m);
    for (const w of [...waiters]) if (w.match(m)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(m); }
  });
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  return {
    child, events, exited,
    next: (match, boundMs = 60_000) => {
      const seen = events.find(match);
      if (seen) return Promise.resolve(seen);
      // a bound against hangs (a case whose event never comes fails, it does not wait forever)
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no such event from worker ${child.pid} (events: ${JSON.stringify(events.slice(-5))})`)), boundMs);
        waiters.push({ match, resolve: (e) => { clearTimeout(timer); resolve(e); } });
      });
    },
  };
}

/** Wait (a bound against hangs, never an assertion) until `check` answers something truthy. */
export async function until<T>(check: () => Promise<T>, what: string, boundMs = 60_000): Promise<NonNullable<T>> {
  const end = Date.now() + boundMs;
  for (;;) {
    const got = await check();
    if (got) return got as NonNullable<T>;
    if (Date.now() > end) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
