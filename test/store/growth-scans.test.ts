/**
 * From an empty database through 100,000 payments, no statement reads the
 * key tables whole: pg_stat_user_tables counts no sequential scan of
 * idempotency_keys, idempotency_processing or (the new form's: TEST_KEY_FORM=old has none)
 * idempotency_answers while the service's request
 * path runs, through the statistics autovacuum gives them on the way (run
 * here by hand where autovacuum would run: past each table's thresholds,
 * sql/engine/00006 and 00018; the server's own naptime is a minute and shared).
 * Today's main read the whole key table per batch of claims: 5,153 scans
 * for 8,494 payments (issue 25).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { firstLooks, KEY_TABLES, type KeyTable } from '../support/autovacuum'
import { waitFor } from '../support/wait'

const PAYMENTS = 100_000
const CONCURRENCY = 48
/** A replay is of the payment this many before: done long since (48 run at once). */
const REPLAY_BEHIND = 500
/** Keys of the new form (sql/engine/00020): their answers are a table of their own. */
const apart = process.env.TEST_KEY_FORM !== 'old'
const TABLES: readonly KeyTable[] = apart ? KEY_TABLES : KEY_TABLES.filter((table) => table !== 'idempotency_answers')
/** Payments after which autovacuum would look at each table: first past its thresholds (firstLooks), then at all. */
const vacuumAt = new Map<number, Set<KeyTable>>()

let db: TestDatabase
let app: InProcessService
beforeAll(async () => {
  db = await createTestDatabase('growth_scans')
  for (const table of TABLES) await db.sql.unsafe(`alter table ${table} set (autovacuum_enabled = false)`)
  const first = await firstLooks(db.sql, apart)
  for (const n of [30_000, 70_000]) vacuumAt.set(n, new Set(TABLES))
  for (const table of TABLES) vacuumAt.set(first[table], (vacuumAt.get(first[table]) ?? new Set()).add(table))
  expect(Math.max(...TABLES.map((table) => first[table]))).toBeLessThan(30_000)
  // Without the replay cache: every replay reads its key (and in the new form its answer) from the database.
  app = await startApp(db, { env: { REPLAY_CACHE_ENTRIES: '0' } })
})
afterAll(async () => {
  await app?.stop()
  await db?.drop()
})

/**
 * Autovacuum's look, by hand. The answers' is without index cleanup: a vacuum summarizes the new page ranges of
 * their BRIN index by reading each range, and PostgreSQL counts each read as a sequential scan of the table
 * (10 at 30,000 answers, 15 more at 70,000: a range of 128 pages each), the vacuum's, not the request path's.
 * The statistics, which are what the plans see, are the same.
 */
async function vacuumAnalyze(tables: ReadonlySet<KeyTable>): Promise<void> {
  const plain = [...tables].filter((table) => table !== 'idempotency_answers')
  if (plain.length > 0) await db.sql.unsafe(`vacuum analyze ${plain.join(', ')}`)
  if (tables.has('idempotency_answers')) await db.sql`vacuum (analyze, index_cleanup off) idempotency_answers`
}

interface Scans { relname: string; seq_scan: number; idx_scan: number }

async function scans(): Promise<Map<string, Scans>> {
  // Counters are flushed by each backend at most once a second: read what they have now.
  await db.sql`select pg_stat_clear_snapshot()`
  const rows = await db.sql<Scans[]>`
    select relname, seq_scan::int, coalesce(idx_scan, 0)::int as idx_scan from pg_stat_user_tables
     where relname in ${db.sql(TABLES)}`
  return new Map(rows.map((row) => [row.relname, row]))
}

test(`${PAYMENTS.toLocaleString('en')} fresh payments from an empty database: no sequential scan of the key tables`, async () => {
  const before = await scans()
  let next = 0
  let vacuums = 0
  const statuses = new Map<number, number>()
  const replays = new Map<string, number>()
  const started = performance.now()
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < PAYMENTS) {
      const n = next++
      const tables = vacuumAt.get(n)
      if (tables) {
        vacuums++
        await vacuumAnalyze(tables)
      }
      const pay = (m: number) => app.fetch('/api/payments', {
        method: 'POST',
        headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': `growth-${m}` },
        body: JSON.stringify({ amount: 100 + (m % 900), currency: 'EUR', customer: `cus_growth_${m % 1000}` }),
      })
      const response = await pay(n)
      await response.arrayBuffer()
      statuses.set(response.status, (statuses.get(response.status) ?? 0) + 1)
      // A client's retry of a payment long done, every hundredth: its answer is read (a replay), by the key and its answer.
      if (n % 100 === 0 && n >= REPLAY_BEHIND) {
        const replay = await pay(n - REPLAY_BEHIND)
        await replay.arrayBuffer()
        const seen = `${replay.status} ${replay.headers.get('idempotent-replayed') === 'true' ? 'replayed' : 'not replayed'}`
        replays.set(seen, (replays.get(seen) ?? 0) + 1)
      }
    }
  }))
  const seconds = (performance.now() - started) / 1000
  // Every backend that served the load flushes its counters as it exits (PostgreSQL 15+; older: its last
  // message to the collector): close the pools and wait until none of their backends is left.
  await app.stop()
  await db.pools.close(1)
  await waitFor(async () => (await db.sql`
    select 1 from pg_stat_activity where application_name like ${`test:growth_scans%`}`).length === 0, 'the pools\' backends to exit')
  const after = await scans()
  const delta = (table: string, field: 'seq_scan' | 'idx_scan') => after.get(table)![field] - before.get(table)![field]
  console.log(`${PAYMENTS} payments in ${seconds.toFixed(1)} s (${Math.round(PAYMENTS / seconds)}/s), ${vacuums} vacuums; ` +
    `sequential scans: ${TABLES.map((table) => `${table} ${delta(table, 'seq_scan')}`).join(', ')}; ` +
    `index scans: ${TABLES.map((table) => `${table} ${delta(table, 'idx_scan')}`).join(', ')}`)

  expect(Object.fromEntries(statuses)).toEqual({ 201: PAYMENTS })
  expect(Object.fromEntries(replays)).toEqual({ '201 replayed': (PAYMENTS - REPLAY_BEHIND) / 100 })
  expect(vacuums).toBe(vacuumAt.size)
  const [row] = await db.sql<{ payments: number }[]>`select count(*)::int as payments from payments`
  expect(row!.payments).toBe(PAYMENTS)
  expect(Object.fromEntries(TABLES.map((table) => [table, delta(table, 'seq_scan')]))).toEqual(Object.fromEntries(TABLES.map((table) => [table, 0])))
  // The counters did count: every claim probed the keys, every completion the list (and the answers).
  expect(delta('idempotency_keys', 'idx_scan')).toBeGreaterThan(PAYMENTS / 128)
  for (const table of TABLES.slice(1)) expect(delta(table, 'idx_scan')).toBeGreaterThan(0)
}, 300_000)
