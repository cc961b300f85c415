import { afterAll, beforeAll, beforeEach, expect, test } from 'bun:test'
import { createLogger } from '../../src/log'
import { DatabaseGauges } from '../../src/metrics/gauges'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { createKey, deleteKeys, fingerprintOf, identity } from '../support/keys'
import { sample } from './factories'

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('gauges') })
afterAll(async () => { await db?.drop() })
beforeEach(async () => { await deleteKeys(db.sql) })

const NOW = new Date('2030-01-01T12:00:00Z')
const ago = (seconds: number) => new Date(NOW.getTime() - seconds * 1000)

function gauges(options: Partial<ConstructorParameters<typeof DatabaseGauges>[0]> = {}) {
  return new DatabaseGauges({ sql: db.pools.short, ttlSeconds: 30, tenants: ['acme', 'globex'], cacheMs: 0, now: () => NOW, ...options })
}

async function scrape(g: DatabaseGauges): Promise<string> {
  await g.refresh()
  return g.registry.metrics()
}

test('stale keys are counted per tenant, only past the TTL; the oldest age is the oldest lease', async () => {
  await createKey(db.sql, identity({ tenant: 'acme' }), { status: 'processing', lockedAt: ago(31) })
  await createKey(db.sql, identity({ tenant: 'acme' }), { status: 'processing', lockedAt: ago(600) })
  await createKey(db.sql, identity({ tenant: 'acme' }), { status: 'processing', lockedAt: ago(29) }) // in flight, not stale yet
  await createKey(db.sql, identity({ tenant: 'globex' }), { status: 'processing', lockedAt: ago(45) })
  await createKey(db.sql, identity({ tenant: 'globex' }), { status: 'done', completedAt: ago(7200) }) // completed keys never count
  const text = await scrape(gauges())
  expect(sample(text, 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(2)
  expect(sample(text, 'idempotency_stale_processing_keys', { tenant: 'globex' })).toBe(1)
  expect(sample(text, 'idempotency_oldest_processing_age_seconds')).toBe(600)
  expect(sample(text, 'idempotency_gauges_refresh_failed', { query: 'processing' })).toBe(0)
})

test('with nothing in processing every tenant reads 0, so alerts see a value rather than an absence', async () => {
  await createKey(db.sql, identity(), { status: 'done', completedAt: ago(10) })
  const text = await scrape(gauges())
  expect(sample(text, 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(0)
  expect(sample(text, 'idempotency_stale_processing_keys', { tenant: 'globex' })).toBe(0)
  expect(sample(text, 'idempotency_oldest_processing_age_seconds')).toBe(0)
  expect(sample(text, 'idempotency_duplicate_entities', { tenant: 'acme' })).toBe(0)
})

test('a request completed under new keys on every retry counts as duplicates; one key, other tenants and old completions do not', async () => {
  const retried = fingerprintOf('same body, new key per retry')
  for (let i = 0; i < 3; i++) await createKey(db.sql, identity({ tenant: 'acme', fingerprint: retried }), { status: 'done', completedAt: ago(60 * (i + 1)) })
  // the same request from another tenant is another client's request
  await createKey(db.sql, identity({ tenant: 'globex', fingerprint: retried }), { status: 'done', completedAt: ago(60) })
  // the same body on another route is another request
  await createKey(db.sql, identity({ tenant: 'acme', fingerprint: retried, path: '/api/refunds' }), { status: 'done', completedAt: ago(60) })
  // a repeat outside the one-hour window is history
  const old = fingerprintOf('old')
  await createKey(db.sql, identity({ tenant: 'globex', fingerprint: old }), { status: 'done', completedAt: ago(7200) })
  await createKey(db.sql, identity({ tenant: 'globex', fingerprint: old }), { status: 'done', completedAt: ago(60) })
  // one still in processing has not completed twice (yet)
  const pending = fingerprintOf('pending')
  await createKey(db.sql, identity({ tenant: 'globex', fingerprint: pending }), { status: 'done', completedAt: ago(60) })
  await createKey(db.sql, identity({ tenant: 'globex', fingerprint: pending }), { status: 'processing', lockedAt: ago(1) })
  const text = await scrape(gauges())
  expect(sample(text, 'idempotency_duplicate_entities', { tenant: 'acme' })).toBe(2) // 3 completions of one request: 2 extra
  expect(sample(text, 'idempotency_duplicate_entities', { tenant: 'globex' })).toBe(0)
})

test('a shorter window leaves out the repeats completed before it', async () => {
  const retried = fingerprintOf('retried ten minutes ago, and again now')
  await createKey(db.sql, identity({ tenant: 'acme', fingerprint: retried }), { status: 'done', completedAt: ago(600) })
  await createKey(db.sql, identity({ tenant: 'acme', fingerprint: retried }), { status: 'done', completedAt: ago(60) })
  expect(sample(await scrape(gauges()), 'idempotency_duplicate_entities', { tenant: 'acme' })).toBe(1)
  expect(sample(await scrape(gauges({ duplicateWindowSeconds: 300 })), 'idempotency_duplicate_entities', { tenant: 'acme' })).toBe(0)
})

test('concurrent scrapes share one query, and the cache holds for its interval', async () => {
  const g = gauges({ cacheMs: 60_000 })
  await Promise.all(Array.from({ length: 25 }, () => g.refresh()))
  expect(g.queries).toBe(1)
  await createKey(db.sql, identity(), { status: 'processing', lockedAt: ago(120) })
  await g.refresh()
  expect(g.queries).toBe(1) // cached: the new stale key is not seen yet
  expect(sample(await g.registry.metrics(), 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(0)

  const uncached = gauges({ cacheMs: 0 })
  await Promise.all(Array.from({ length: 25 }, () => uncached.refresh()))
  expect(uncached.queries).toBe(1) // still single-flight
  await uncached.refresh()
  expect(uncached.queries).toBe(2)
  expect(sample(await uncached.registry.metrics(), 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(1)
})

test('a database that does not answer in time: the scrape answers with the last values and the failure flag', async () => {
  await createKey(db.sql, identity(), { status: 'processing', lockedAt: ago(120) })
  const lines: string[] = []
  const g = gauges({ timeoutMs: 200, log: createLogger({ sink: (line) => lines.push(line) }) })
  expect(sample(await scrape(g), 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(1)

  // An ACCESS EXCLUSIVE lock (as a careless ALTER TABLE takes) blocks every read of the table.
  const blocker = await db.sql.reserve()
  try {
    await blocker`begin`
    await blocker`lock table idempotency_keys, idempotency_processing in access exclusive mode`
    const text = await scrape(g)
    expect(sample(text, 'idempotency_gauges_refresh_failed', { query: 'processing' })).toBe(1)
    expect(sample(text, 'idempotency_gauges_refresh_failed', { query: 'duplicates' })).toBe(1)
    expect(sample(text, 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(1) // the last values
    expect(lines.join('\n')).toContain('canceling statement due to statement timeout')
  } finally {
    await blocker`rollback`
    blocker.release()
  }
  const recovered = await scrape(g)
  expect(sample(recovered, 'idempotency_gauges_refresh_failed', { query: 'processing' })).toBe(0)
  expect(sample(recovered, 'idempotency_gauges_last_success_timestamp_seconds', { query: 'processing' })).toBeGreaterThan(0)
})

test('the purge\'s overdue seconds: how long past its retention the next key the purge deletes (the oldest created) has waited; 0 when none', async () => {
  const retention = 3600
  const overdue = async () => sample(await scrape(gauges({ retentionSeconds: retention })), 'idempotency_purge_overdue_seconds')
  expect(await overdue()).toBe(0)
  // Created before the cut-off but completed within the retention: not past it yet, though the oldest.
  await createKey(db.sql, identity({ key: 'late' }), { status: 'done', lockedAt: ago(retention + 500), completedAt: ago(retention - 10) })
  // Stuck in processing since long ago: the purge never deletes it.
  await createKey(db.sql, identity({ key: 'stuck' }), { status: 'processing', lockedAt: ago(retention + 1000) })
  expect(await overdue()).toBe(0)
  await createKey(db.sql, identity({ key: 'next' }), { status: 'done', lockedAt: ago(retention + 200), completedAt: ago(retention + 120) })
  await createKey(db.sql, identity({ key: 'after' }), { status: 'done', lockedAt: ago(retention + 150), completedAt: ago(retention + 140) })
  expect(await overdue()).toBe(120)
  await deleteKeys(db.sql, 'next')
  expect(await overdue()).toBe(140)
  expect(sample(await scrape(gauges({ retentionSeconds: retention })), 'idempotency_gauges_refresh_failed', { query: 'purge' })).toBe(0)
})
