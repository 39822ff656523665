/**
 * The create's fingerprint (docs/app-contract.md): sha256 of what it asked for in canonical JSON,
 * byte for byte what recon_dagster computes (Python's json.dumps with sorted keys, no spaces and
 * ASCII escapes), so the orphan sweep matches the tasks a Node worker created.
 */
import { createHash } from "node:crypto";

const CALLBACK_KEYS = new Set(["webhook", "webhook_events_filter", "callBackUrl", "name"]);
const SECRET_KEYS = new Set(["api_key", "apikey", "token", "authorization", "password", "secret", "key"]);

function scrub(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(scrub);
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) if (!SECRET_KEYS.has(k.toLowerCase())) out[k] = scrub(v);
    return out;
  }
  return value;
}

// JSON.stringify escapes as Python does except non-ASCII, which Python writes as \uXXXX (per
// UTF-16 unit, lowercase hex).
function ascii(text: string): string {
  return text.replace(/[\u007f-\uffff]/g, (c) => (c === "\u007f" ? c : "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0")));
}

function canonical(value: unknown): string {
  if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort();
    return "{" + keys.map((k) => ascii(JSON.stringify(k)) + ":" + canonical((value as Record<string, unknown>)[k])).join(",") + "}";
  }
  return ascii(JSON.stringify(value) ?? "null");
}

/** sha256 (hex) of the request's `input` (else the body without callback keys), credentials left
 * out. A float written as an integer (`1.0`) differs from Python's: pass what the request sends. */
export function fingerprint(payload: unknown): string {
  let asked: unknown = payload;
  if (payload !== null && typeof payload === "object" && !Array.isArray(payload) && "input" in payload) {
    asked = (payload as Record<string, unknown>).input;
  }
  if (asked !== null && typeof asked === "object" && !Array.isArray(asked)) {
    asked = Object.fromEntries(Object.entries(asked).filter(([k]) => !CALLBACK_KEYS.has(k)));
  }
  return createHash("sha256").update(canonical(scrub(asked))).digest("hex");
}
