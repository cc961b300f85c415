/**
 * `npm run migrate` (src/store/migrate-cli.ts) refuses to migrate through
 * PgBouncer, as the service does: with DATABASE_PGBOUNCER=1 it exits 2 and
 * touches nothing. (A real PgBouncer URL without the flag is refused too:
 * test/scale/pgbouncer.scale.ts, where a PgBouncer runs.)
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'

let name: string
let url: string
beforeAll(async () => {
  name = `idem_migrate_cli_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  await admin.end()
  const u = new URL(process.env.DATABASE_URL!)
  u.pathname = `/${name}`
  url = u.toString()
})
afterAll(async () => {
  const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`drop database if exists "${name}" with (force)`)
  await admin.end()
})

async function migrateCli(env: Record<string, string>): Promise<{ code: number; out: string; err: string }> {
  const proc = Bun.spawn([process.execPath, 'src/store/migrate-cli.ts'], { env: { ...process.env, ...env }, stdout: 'pipe', stderr: 'pipe' })
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, out, err }
}

async function tables(): Promise<number> {
  const sql = postgres(url, { max: 1, onnotice: () => undefined })
  try {
    const [row] = await sql<{ n: number }[]>`select count(*)::int as n from pg_tables where schemaname = current_schema()`
    return row!.n
  } finally {
    await sql.end()
  }
}

test('DATABASE_PGBOUNCER=1: refused with exit 2 and the command to run instead; nothing migrated', async () => {
  const { code, err } = await migrateCli({ DATABASE_URL: url, DATABASE_PGBOUNCER: '1' })
  expect(code).toBe(2)
  expect(err).toContain('refusing to migrate with DATABASE_PGBOUNCER=1')
  expect(err).toContain('against PostgreSQL directly')
  expect(await tables()).toBe(0)
})

test('straight to PostgreSQL: migrated', async () => {
  const { code, out } = await migrateCli({ DATABASE_URL: url })
  expect(code).toBe(0)
  expect(out).toMatch(/schema at migrations engine \d+, service \d+ \(\d+ applied\)/)
  expect(await tables()).toBeGreaterThan(0)
})
