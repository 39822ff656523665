/**
 * How the package reaches the contract's functions (schema `recon` of the app's database). One
 * method: call a function by name with named arguments, get its jsonb answer. node-postgres is
 * the default driver; anything with supabase-js's `rpc(name, args)` shape works through
 * `rpcCaller`.
 */

/** A function's answer: `next` says what the caller must do next (docs/app-contract.md). */
export interface Answer {
  next: string;
  reason?: string;
  message?: string;
  [key: string]: unknown;
}

export interface ContractCaller {
  /** Call `recon.<fn>` with `args` by name (`job` is `p_job`); resolves to its answer. */
  call(fn: string, args: Record<string, unknown>): Promise<Answer>;
}

/** What node-postgres's `Pool` and `Client` both offer. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }>;
}

// The SQL type of each named argument (node-postgres sends text; PostgreSQL must pick the
// function's overload by name, so every argument is cast).
const TYPES: Record<string, string> = {
  job: "uuid", create: "uuid", provider: "text", kind: "text", fingerprint: "text",
  marker_sent: "boolean", task_id: "text", state: "text", detail: "text", account: "text",
  bucket: "text", max_wait_s: "double precision", n: "integer", refund: "integer",
  holder: "text", ttl_s: "double precision", cap: "integer", reserve: "integer",
  holders: "text[]", slot: "integer", seconds: "double precision",
};

const NAME = /^[a-z_]+$/;

/** A caller over node-postgres: each call is one statement (its own transaction unless the
 * `Queryable` is a client inside one). */
export function pgCaller(db: Queryable, schema = "recon"): ContractCaller {
  if (!NAME.test(schema)) throw new Error(`schema must be a plain name, got ${schema}`);
  return {
    async call(fn, args) {
      if (!NAME.test(fn)) throw new Error(`not a contract function name: ${fn}`);
      const names = Object.keys(args).filter((k) => args[k] !== undefined);
      const params = names.map((k, i) => {
        const type = TYPES[k];
        if (type === undefined || !NAME.test(k)) throw new Error(`unknown argument ${k} of recon.${fn}`);
        return `p_${k} => $${i + 1}::${type}`;
      });
      const { rows } = await db.query(
        `SELECT ${schema}.${fn}(${params.join(", ")}) AS a`,
        names.map((k) => args[k]),
      );
      return rows[0]?.a as Answer;
    },
  };
}

/** What supabase-js's `supabase.schema("recon")` offers (and any PostgREST-like client). */
export interface RpcClient {
  rpc(fn: string, args?: Record<string, unknown>): PromiseLike<{ data: unknown; error: unknown }>;
}

/** A caller over an `rpc(name, args)` client: arguments are sent as `p_<name>`. */
export function rpcCaller(client: RpcClient): ContractCaller {
  return {
    async call(fn, args) {
      const named: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(args)) if (v !== undefined) named[`p_${k}`] = v;
      const { data, error } = await client.rpc(fn, named);
      if (error) {
        const message = typeof error === "object" && error !== null && "message" in error ? String(error.message) : String(error);
        throw new Error(`recon.${fn} failed: ${message}`);
      }
      return data as Answer;
    },
  };
}
