/**
 * The conformance table (contract/scenarios.json) through this package on real PostgreSQL: every
 * scenario ends with the rows the Python runner checks. Played twice: through `pgCaller`
 * (node-postgres, typed arguments) and through `rpcCaller` over a PostgREST-like shim (untyped
 * named arguments, as supabase-js sends them).
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { CONTRACT_VERSION, pgCaller, rpcCaller, checkContract, ContractMismatch, type ContractCaller, type RpcClient } from "../src/index.js";
import { createDb, type TestDb } from "./support/db.js";
import { load, play } from "./support/scenarios.js";

/** What PostgREST does with `rpc(fn, {p_x: ...})`: named arguments, types left to PostgreSQL. */
function postgrestLike(pool: pg.Pool): RpcClient {
  return {
    async rpc(fn, args = {}) {
      const names = Object.keys(args);
      try {
        const { rows } = await pool.query(`SELECT recon.${fn}(${names.map((k, i) => `${k} => $${i + 1}`).join(", ")}) AS a`, names.map((k) => args[k]));
        return { data: rows[0]?.a, error: null };
      } catch (e) {
        return { data: null, error: { message: (e as Error).message } };
      }
    },
  };
}

const scenarios = load();
let db: TestDb;
const pools: pg.Pool[] = [];

before(async () => {
  db = await createDb();
});
after(async () => {
  await Promise.all(pools.map((p) => p.end()));
  await db.drop();
});

/** Each process of a scenario gets its own pool (its own connections). */
function processes(make: (pool: pg.Pool) => ContractCaller): (name: string) => ContractCaller {
  const byName = new Map<string, ContractCaller>();
  return (name) => {
    let c = byName.get(name);
    if (!c) {
      const pool = new pg.Pool({ connectionString: db.url, max: 2 });
      pools.push(pool);
      c = make(pool);
      byName.set(name, c);
    }
    return c;
  };
}

for (const [label, make] of [
  ["node-postgres", (p: pg.Pool) => pgCaller(p)],
  ["supabase-js rpc()", (p: pg.Pool) => rpcCaller(postgrestLike(p))],
] as const) {
  describe(`the conformance table through ${label}`, () => {
    for (const scenario of scenarios) {
      it(scenario.name, async () => {
        await db.empty();
        assert.deepEqual(await play(db.pool, processes(make), scenario), []);
      });
    }
  });
}

describe("the runner and the version check", () => {
  it("a scenario expecting the wrong rows is caught (the runner is not vacuous)", async () => {
    await db.empty();
    const answered = scenarios.find((s) => s.name === "async create answered")!;
    const wrong = { ...answered, rows: { jobs: { job: { provider_task_id: "another-task" } } } };
    assert.deepEqual(await play(db.pool, processes((p) => pgCaller(p)), wrong), ['jobs[job].provider_task_id is "task-1", expected "another-task"']);
  });

  it("the database answers this package's contract version", async () => {
    // 3 since migration 170; this package needs 2 (it records an answer in one transaction)
    assert.ok((await checkContract(pgCaller(db.pool))) >= CONTRACT_VERSION);
  });

  it("a database without the functions fails the start with one line", async () => {
    const bare = new pg.Pool({ connectionString: db.url.replace(/\/[^/]*$/, "/postgres"), max: 1 });
    try {
      await assert.rejects(checkContract(pgCaller(bare)), (e: unknown) => {
        assert.ok(e instanceof ContractMismatch);
        assert.match(e.message, /^the app's database has no recon_dagster contract functions .*: run `recon-dagster migrate`$/);
        assert.ok(!e.message.includes("\n"));
        return true;
      });
    } finally {
      await bare.end();
    }
  });

  it("a database of an older contract fails the start with one line", async () => {
    const older: ContractCaller = { call: async () => 1 as never };
    await assert.rejects(checkContract(older), /^ContractMismatch: the app's database has contract version 1, this worker needs 2: run `recon-dagster migrate`$/);
  });
});
