/**
 * A PostgreSQL database of the test's own, migrated by the repository's `recon-dagster migrate`
 * (the repo's `.venv`), dropped afterwards. The server: RECON_DATABASE_URL, else the machine's
 * PostgreSQL at 127.0.0.1:5432.
 */
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import pg from "pg";

pg.types.setTypeParser(20, (v) => Number(v)); // bigint counts and seqs as numbers in the tests

const run = promisify(execFile);

/** The repository's root (where contract/scenarios.json is). */
export const REPO = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "contract", "scenarios.json"))) {
    const up = resolve(dir, "..");
    if (up === dir) throw new Error("the repository's contract/scenarios.json not found above " + fileURLToPath(import.meta.url));
    dir = up;
  }
  return dir;
})();

export const VENV_BIN = process.env.RECON_VENV_BIN ?? join(REPO, ".venv", "bin");

export function tool(name: string): string {
  const path = join(VENV_BIN, name);
  if (!existsSync(path)) throw new Error(`${path} missing: create the repo's .venv first (python3 -m venv .venv && .venv/bin/pip install -e '.[dev]')`);
  return path;
}

export const SERVER = process.env.RECON_DATABASE_URL ?? "postgresql://root@127.0.0.1:5432/postgres";

export interface TestDb {
  url: string;
  pool: pg.Pool;
  /** Every table emptied (as the Python suite's `db` fixture does before each test). */
  empty(): Promise<void>;
  drop(): Promise<void>;
}

function withDatabase(url: string, name: string): string {
  const u = new URL(url);
  u.pathname = "/" + name;
  return u.toString();
}

export async function createDb(prefix = "recon_node"): Promise<TestDb> {
  const name = `${prefix}_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  const admin = new pg.Client({ connectionString: SERVER });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const url = withDatabase(SERVER, name);
  await run(tool("recon-dagster"), ["migrate", "--database-url", url], { cwd: REPO, env: { ...process.env, RECON_DATABASE_URL: url } });
  const pool = new pg.Pool({ connectionString: url, max: 8 });
  return {
    url,
    pool,
    async empty() {
      const { rows } = await pool.query("SELECT string_agg(quote_ident(tablename), ', ') AS t FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'recon_schema_migrations'");
      await pool.query(`TRUNCATE ${rows[0]!.t} RESTART IDENTITY CASCADE`);
    },
    async drop() {
      await pool.end();
      const a = new pg.Client({ connectionString: SERVER });
      await a.connect();
      try {
        await a.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await a.end();
      }
    },
  };
}
