/**
 * An existing single-node database moved onto Citus workers online, by the
 * documented steps (docs/how-to/citus.md): migrated before citus was there,
 * serving writes, then `create extension citus`, the coordinator and workers
 * named, and `npm run migrate -- --distribute`
 * (create_distributed_table_concurrently, outside the runner's transaction).
 * Writes go on during it; afterwards every row is on the workers, co-located
 * by tenant, nothing lost.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { citusMode } from '../../src/store/citus'
import { migrateService } from '../../src/store/migrate'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../support/citus'
import { captureOutput } from '../support/process'

let cluster: CitusCluster
let db: CitusDatabase
let sql: postgres.Sql

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('online', { shardCount: 4, plain: true })
  sql = postgres(db.url, { max: 4, onnotice: () => undefined })
}, 120_000)

afterAll(async () => {
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

const TENANTS = 8

/** A completed key and its payment, as the service writes them. */
async function pay(n: number): Promise<void> {
  const tenant = `tenant-${n % TENANTS}`
  await sql.begin(async (tx) => {
    await tx`insert into idempotency_keys (tenant, key, method, path, fingerprint, status, completed_at, response_status, response_body)
             values (${tenant}, ${`k-${n}`}, 'POST', '/api/payments', ${'a'.repeat(64)}, 'done', now(), 201, '{}')`
    await tx`insert into payments (tenant, amount, currency, customer, status, provider_ref, idempotency_key)
             values (${tenant}, 100, 'EUR', 'c', 'succeeded', ${`ref-${n}`}, ${`k-${n}`})`
  })
}

test('a migrated single-node database is distributed online by `npm run migrate -- --distribute`, its rows kept, writes going on', async () => {
  await migrateService(db.url)
  expect(await citusMode(sql)).toBe('none')
  for (let n = 0; n < 400; n++) await pay(n)
  await sql`insert into idempotency_keys (tenant, key, method, path, fingerprint, status) values ('tenant-1', 'stuck', 'POST', '/p', ${'b'.repeat(64)}, 'processing')`
  await sql`insert into idempotency_audit (actor, action, tenant, key, outcome) values ('cli:op', 'force_expire', 'tenant-1', 'k-1', 'expired')`

  // The documented steps: citus on the coordinator's database, the nodes named.
  await sql`create extension citus`
  await sql`select citus_set_coordinator_host('127.0.0.1', ${cluster.coordinator.port})`
  for (const worker of cluster.workers) await sql`select citus_add_node('127.0.0.1', ${worker.port})`
  expect(await citusMode(sql)).toBe('local')
  // Without --distribute, a migration says what is left to do, and leaves the tables local.
  const hint = Bun.spawn(['bun', 'src/store/migrate-cli.ts'], { env: { ...process.env, DATABASE_URL: db.url }, stdout: 'pipe', stderr: 'pipe' })
  const hintOutput = captureOutput(hint)
  expect(await hint.exited).toBe(0)
  await hintOutput.ended
  expect(hintOutput()).toContain('its tables are local to the coordinator: run `npm run migrate -- --distribute`')
  expect(await citusMode(sql)).toBe('local')

  // Writes while it distributes: each one either commits (and is found after) or fails; none is lost silently.
  let writing = true
  let next = 1000
  const committed: number[] = []
  const failed: string[] = []
  const writer = (async () => {
    while (writing) {
      const n = next++
      try {
        await pay(n)
        committed.push(n)
      } catch (error) {
        failed.push((error as Error).message)
      }
    }
  })()

  const proc = Bun.spawn(['bun', 'src/store/migrate-cli.ts', '--distribute'], { env: { ...process.env, DATABASE_URL: db.url }, stdout: 'pipe', stderr: 'pipe' })
  const output = captureOutput(proc)
  const code = await proc.exited
  await output.ended
  writing = false
  await writer
  expect({ code, output: output() }).toMatchObject({ code: 0 })
  expect(output()).toContain('distributed: idempotency_settings, idempotency_processes, idempotency_key_form, idempotency_keys, idempotency_processing, idempotency_audit, idempotency_answers, payments')
  expect(await citusMode(sql)).toBe('distributed')

  const layout = await sql<{ table: string; method: string; colocated: boolean }[]>`
    select logicalrelid::text as table, partmethod as method,
           colocationid = (select colocationid from pg_dist_partition where logicalrelid = 'idempotency_keys'::regclass) as colocated
      from pg_dist_partition order by 1`
  expect([...layout]).toEqual([
    { table: 'idempotency_answers', method: 'h', colocated: true },
    { table: 'idempotency_audit', method: 'h', colocated: true },
    { table: 'idempotency_key_form', method: 'n', colocated: false },
    { table: 'idempotency_keys', method: 'h', colocated: true },
    { table: 'idempotency_processes', method: 'n', colocated: false },
    { table: 'idempotency_processing', method: 'h', colocated: true },
    { table: 'idempotency_settings', method: 'n', colocated: false },
    { table: 'payments', method: 'h', colocated: true },
  ])
  // The shards are on the workers, none left on the coordinator.
  const [placed] = await sql<{ coordinator: number; workers: number }[]>`
    select count(*) filter (where p.groupid = 0)::int as coordinator, count(*) filter (where p.groupid <> 0)::int as workers
      from pg_dist_placement p join pg_dist_shard s using (shardid) where s.logicalrelid = 'idempotency_keys'::regclass`
  expect(placed).toEqual({ coordinator: 0, workers: 4 })

  // Every row kept: the 400 from before, every write that committed during it, the processing entry and the audit.
  const [counts] = await sql<{ keys: number; payments: number; processing: number; audit: number }[]>`
    select (select count(*) from idempotency_key_states where status = 'done')::int as keys, (select count(*) from payments)::int as payments,
           (select count(*) from idempotency_processing)::int as processing, (select count(*) from idempotency_audit)::int as audit`
  expect(counts).toEqual({ keys: 400 + committed.length, payments: 400 + committed.length, processing: 1, audit: 1 })
  expect(committed.length).toBeGreaterThan(0)
  // What failed did so in the switch of one table (writes on both sides of it), and is counted, not lost.
  expect(failed.length).toBeLessThan(committed.length)

  // The request path's functions are distributed by their tenant (sql/engine/00012), the others made on every node.
  const functions = await sql<{ name: string; byTenant: boolean }[]>`
    select p.proname as name, o.distribution_argument_index is not null as "byTenant"
      from pg_dist_object o join pg_proc p on p.oid = o.objid where p.pronamespace = 'public'::regnamespace order by 1`
  const expected = await sql<{ name: string; byTenant: boolean }[]>`
    select proname as name, coalesce(proargnames[1] = 'p_tenant', false) as "byTenant" from pg_proc
     where pronamespace = 'public'::regnamespace and prokind = 'f' order by 1`
  expect([...functions]).toEqual([...expected])
  expect(functions.some((f) => f.byTenant)).toBe(true)

  // Run again: nothing left to do.
  const again = Bun.spawn(['bun', 'src/store/migrate-cli.ts', '--distribute'], { env: { ...process.env, DATABASE_URL: db.url }, stdout: 'pipe', stderr: 'pipe' })
  const againOutput = captureOutput(again)
  expect(await again.exited).toBe(0)
  await againOutput.ended
  expect(againOutput()).toContain('nothing to distribute')
}, 180_000)
