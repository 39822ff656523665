/**
 * The account's shared budget around any provider request: the same rows every recon_dagster
 * process draws on (tokens per bucket, concurrency slots, the provider's Retry-After).
 */
import type { Answer, ContractCaller } from "./caller.js";
import { ContractCallError, NotSent } from "./errors.js";

const sleep = (s: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, s) * 1000));

function fixCall(fn: string, a: Answer): Answer {
  if (a.next === "fix_call") throw new ContractCallError(String(a.reason), `recon.${fn}: ${a.message ?? a.reason}`);
  return a;
}

export type Bucket = "read" | "create";

/**
 * Take one token of the account's `bucket`, waiting at most `maxWaitS` seconds for it (NULL: any).
 * Resolves when the request may be sent (`false`: the account has no shared budget, send under
 * your own limit); throws `NotSent` when no token comes within the bound or a Retry-After blocks
 * the account.
 */
export async function takeToken(caller: ContractCaller, account: string, bucket: Bucket, maxWaitS: number | null = 30): Promise<boolean> {
  let refund = 0;
  for (;;) {
    const a = fixCall("take_token", await caller.call("take_token", { account, bucket, max_wait_s: maxWaitS, refund: refund || undefined }));
    if (a.next === "no_budget") return false;
    if (a.next === "not_sent") {
      const reason = a.reason === "blocked_by_retry_after" ? "blocked_by_retry_after" : "token_wait";
      throw new NotSent(reason, Number(a.retry_in_s ?? 1), String(a.message ?? reason));
    }
    const wait = Number(a.wait_s ?? 0);
    if (wait <= 0) return true;
    await sleep(wait);
    const b = await caller.call("token_blocked", { account, bucket });
    if (b.next !== "queue_again") return true;
    refund = 1; // a Retry-After came while we slept: give the token back and queue behind it
  }
}

/** The provider answered 429 with `Retry-After: seconds`: nobody on the account sends before then. */
export async function recordRetryAfter(caller: ContractCaller, account: string, seconds: number): Promise<number> {
  const a = fixCall("record_retry_after", await caller.call("record_retry_after", { account, seconds }));
  return Number(a.retry_in_s ?? seconds);
}

export interface SlotOptions {
  ttlS?: number;
  /** Give up after this many seconds without a free slot (`NotSent` slot_wait). */
  maxWaitS?: number;
}

/**
 * Run `request` holding one of the account's concurrency slots, renewed every third of its TTL
 * while the request runs and released however it ends. Without shared slots it just runs.
 */
export async function withSlot<T>(caller: ContractCaller, account: string, kind: string, request: () => Promise<T>, opts: SlotOptions = {}): Promise<T> {
  const ttl = opts.ttlS ?? 180;
  const deadline = Date.now() + (opts.maxWaitS ?? 60) * 1000;
  let a: Answer;
  for (;;) {
    a = fixCall("take_slot", await caller.call("take_slot", { account, kind, ttl_s: ttl }));
    if (a.next !== "ask_again") break;
    const retry = Number(a.retry_in_s ?? 0.05) * (1 + Math.random());
    if (Date.now() + retry * 1000 > deadline) throw new NotSent("slot_wait", retry, String(a.message ?? "no slot free"));
    await sleep(retry);
  }
  if (a.next === "no_budget") return request();
  const slot = Number(a.slot);
  const holder = String(a.holder);
  const timer = setInterval(() => {
    caller.call("renew_slots", { account, holders: [holder], ttl_s: ttl }).catch(() => undefined);
  }, Number(a.renew_every_s ?? ttl / 3) * 1000);
  timer.unref();
  try {
    return await request();
  } finally {
    clearInterval(timer);
    await caller.call("release_slot", { account, slot, holder });
  }
}

/** Seconds of a `Retry-After` header (delta-seconds or an HTTP date), or null. */
export function parseRetryAfter(value: string | null | undefined, now = Date.now()): number | null {
  if (!value) return null;
  const s = Number(value.trim());
  if (Number.isFinite(s)) return s > 0 ? s : null;
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0.001, (at - now) / 1000);
}
