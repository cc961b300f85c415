/**
 * idempotency_forced_expirations_total is read from the audit trail, so that
 * forced expirations count wherever they were made (page, API, CLI, another
 * replica). Against a real database: audit rows in, a scrape out.
 */
import { afterAll, beforeAll, beforeEach, expect, test } from 'bun:test'
import { exposition } from '../../src/metrics/exposition'
import { ForcedExpirationTally } from '../../src/metrics/forced-expirations'
import { DatabaseGauges } from '../../src/metrics/gauges'
import { readForcedExpirations } from '../../src/metrics/read-forced-expirations'
import { createMetrics } from '../../src/metrics/registry'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { deleteKeys } from '../support/keys'
import { sample } from '../metrics/factories'

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('forced_expirations') })
afterAll(async () => { await db?.drop() })
beforeEach(async () => {
  await db.sql`truncate idempotency_audit restart identity`
  await deleteKeys(db.sql)
})

const METRIC = 'idempotency_forced_expirations_total'

function gauges() {
  return new DatabaseGauges({ sql: db.pools.short, ttlSeconds: 30, cacheMs: 0 })
}

async function scrape(g: DatabaseGauges): Promise<string> {
  await g.refresh()
  return g.registry.metrics()
}

async function audit(action: string, outcome: string, detail: Record<string, unknown> = {}, actor = 'cli:ops'): Promise<void> {
  await db.sql`insert into idempotency_audit (actor, action, tenant, key, outcome, detail)
               values (${actor}, ${action}, 'acme', ${action === 'force_expire' ? crypto.randomUUID() : null}, ${outcome}, ${db.sql.json(detail as never)})`
}

const counts = (text: string) => ({
  expired: sample(text, METRIC, { outcome: 'expired' }),
  worker_alive: sample(text, METRIC, { outcome: 'worker_alive' }),
  unchanged: sample(text, METRIC, { outcome: 'unchanged' }),
})

test('an empty trail exposes every outcome at 0, as a counter', async () => {
  const text = await scrape(gauges())
  expect(counts(text)).toEqual({ expired: 0, worker_alive: 0, unchanged: 0 })
  expect(text).toContain(`# TYPE ${METRIC} counter`)
})

test('every force_expire row counts by outcome, whoever made it; a batch\'s skipped live keys count as worker_alive', async () => {
  await audit('force_expire', 'expired', { lease: '1' }, 'admin:alice')
  await audit('force_expire', 'expired', { lease: '2', batch: true }, 'cli:bob') // one per key an expire-all-stale expired
  await audit('force_expire', 'worker_alive', { lease: '3' }, 'api:deploy-bot')
  await audit('force_expire', 'unchanged', { lease: '4' }, 'cli:bob')
  await audit('expire_all_stale', 'expired', { expired: 1, worker_alive: 2 }, 'cli:bob') // the summary: 2 live keys skipped
  await audit('expire_all_stale', 'none_stale', { expired: 0, worker_alive: 0 })
  await audit('purge_expired', 'purged', { purged: 40 }) // not a forced expiration
  const g = gauges()
  expect(counts(await scrape(g))).toEqual({ expired: 2, worker_alive: 3, unchanged: 1 })

  // Counted at the next scrape, though this process made none of them (a CLI in another shell, another replica).
  await audit('force_expire', 'expired', { lease: '5' }, 'cli:carol')
  expect(counts(await scrape(g))).toEqual({ expired: 3, worker_alive: 3, unchanged: 1 })
})

test('in /metrics it appears once, from the database gauges, not from the per-process registry', async () => {
  await audit('force_expire', 'expired')
  const metrics = createMetrics()
  const text = await exposition({ registry: metrics.registry, gauges: gauges() })
  expect(text.split('\n').filter((line) => line === `# TYPE ${METRIC} counter`)).toHaveLength(1)
  expect(sample(text, METRIC, { outcome: 'expired' })).toBe(1)
  expect(sample(text, 'idempotency_gauges_refresh_failed', { query: 'forced_expirations' })).toBe(0)
})

/** The tally against the real trail, one read at a time. */
function tally(chunk?: bigint) {
  const t = new ForcedExpirationTally(chunk === undefined ? {} : { chunk })
  return {
    async read() {
      const range = t.range()
      const totals = t.apply(range, await readForcedExpirations(db.pools.short, range))
      return totals && Object.fromEntries(totals)
    },
    /** The id below which rows are summed once and no longer read. */
    counted: () => t.range().lo,
  }
}

test('a row that commits after a higher id was seen is still counted (identity values are taken at insert, seen at commit)', async () => {
  await audit('force_expire', 'expired')
  const t = tally()
  expect(await t.read()).toMatchObject({ expired: 1 })

  // A slow transaction takes the next id and holds it uncommitted...
  const slow = await db.pools.short.reserve()
  await slow`begin`
  await slow`insert into idempotency_audit (actor, action, tenant, key, outcome) values ('cli:slow', 'force_expire', 'acme', 'late', 'expired')`
  // ...while a faster one takes a higher id and commits.
  await audit('force_expire', 'unchanged')
  const before = t.counted()
  for (let i = 0; i < 5; i++) expect(await t.read()).toMatchObject({ expired: 1, unchanged: 1 }) // the slow row is not visible yet...
  expect(t.counted()).toBe(before) // ...and nothing was settled past it
  await slow`commit`
  slow.release()
  expect(await t.read()).toMatchObject({ expired: 2, unchanged: 1 })
  // and it stays counted once the range settles and later reads only cover the tail
  for (let i = 0; i < 4; i++) expect(await t.read()).toMatchObject({ expired: 2, unchanged: 1 })
  expect(t.counted()).toBe(3n)
})

test('after a start a long trail is counted chunk by chunk, and the series stays absent until all of it is', async () => {
  await db.sql`insert into idempotency_audit (actor, action, tenant, key, outcome)
               select 'cli:ops', 'force_expire', 'acme', 'k' || i, case when i % 5 = 0 then 'worker_alive' else 'expired' end
                 from generate_series(1, 95) i`
  const t = tally(20n)
  const seen: (Record<string, number> | undefined)[] = []
  for (let i = 0; i < 40 && (seen.length === 0 || seen.at(-1) === undefined); i++) seen.push(await t.read())
  expect(seen.slice(0, -1).every((totals) => totals === undefined)).toBe(true) // never a partial count
  expect(seen.at(-1)).toEqual({ expired: 76, worker_alive: 19, unchanged: 0 })
  await audit('force_expire', 'unchanged')
  expect(await t.read()).toEqual({ expired: 76, worker_alive: 19, unchanged: 1 })
})

test('an emptied trail restarts the count (read by Prometheus as a counter reset)', async () => {
  for (let i = 0; i < 3; i++) await audit('force_expire', 'expired')
  const t = tally()
  for (let i = 0; i < 4; i++) expect(await t.read()).toMatchObject({ expired: 3 })
  expect(t.counted()).toBe(3n)
  await db.sql`truncate idempotency_audit restart identity`
  await audit('force_expire', 'expired')
  let totals: Record<string, number> | undefined
  for (let i = 0; i < 5 && !totals; i++) totals = await t.read()
  expect(totals).toMatchObject({ expired: 1 })
})
