/**
 * The operations library on its own, with a moved clock: what the page, the
 * JSON API and the CLI all call. Each test puts keys in the state it needs
 * (no server, no sleeps).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { downstreamKey } from '../../src/core/downstream-key'
import { ownerText } from '../../src/operations/describe'
import { operations, OperationInputError, parseAuditFilters, parseKeyFilters, type Operations } from '../../src/operations'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { createKey, identity, secondsAfter } from '../support/keys'

const NOW = new Date('2026-05-01T03:00:00.000Z')
const TTL = 30
const RETENTION = 3600
const ago = (seconds: number) => secondsAfter(NOW, -seconds)

let db: TestDatabase
let ops: Operations
beforeAll(async () => {
  db = await createTestDatabase('operations')
  ops = operations({ sql: db.pools.short, ttlSeconds: TTL, retentionSeconds: RETENTION, now: () => NOW })
})
afterAll(() => db?.drop())

async function processing(tenant: string, key: string, ageSeconds: number, path = '/api/payments') {
  return (await createKey(db.sql, identity({ tenant, key, path }), { status: 'processing', lockedAt: ago(ageSeconds) })).lease
}

async function released(tenant: string, key: string, releasedSecondsAgo: number) {
  await db.sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, released_at)
    values (${tenant}, ${key}, 'POST', '/api/payments', ${'c'.repeat(64)}, 'released', ${ago(releasedSecondsAgo + 5)}, ${ago(releasedSecondsAgo + 5)}, ${ago(releasedSecondsAgo)})`
}

const keysOf = async (filters: Parameters<typeof parseKeyFilters>[0]) => (await ops.list(parseKeyFilters(filters), { limit: 500 })).keys.map((key) => key.key)

describe('list and count follow the same filters', () => {
  beforeAll(async () => {
    await processing('list-a', 'order-1', 3600)
    await processing('list-a', 'order-2', 5)
    await processing('list-a', 'refund-1', 7200, '/api/refunds')
    await processing('list-b', 'order-1', 4000)
    await processing('list-b', 'order-9', 4100)
    await processing('list-b', 'odd%_key', 4200)
  })

  test('tenant, route, key and stale narrow the list; stale keys come first', async () => {
    expect(await keysOf({ tenant: 'list-a' })).toEqual(['refund-1', 'order-1', 'order-2'])
    expect(await keysOf({ tenant: 'list-a', stale: '1' })).toEqual(['refund-1', 'order-1'])
    expect(await keysOf({ tenant: 'list-a', route: 'POST /api/payments' })).toEqual(['order-1', 'order-2'])
    expect(await keysOf({ tenant: 'list-a', route: '/api/refunds' })).toEqual(['refund-1'])
    expect(await keysOf({ key: 'order-1' })).toEqual(['order-1', 'order-1'])
    // The key search is a plain substring: % and _ are characters, not wildcards.
    expect(await keysOf({ key: '%_' })).toEqual(['odd%_key'])
    expect(await keysOf({ key: 'r_1' })).toEqual([])
  })

  test('counts say what the list shows: one tenant\'s filter counts that tenant only', async () => {
    const one = await ops.count(parseKeyFilters({ tenant: 'list-a', stale: '1' }))
    expect(one).toMatchObject({ processing: 3, stale: 2, matching: 2 })
    expect(one.oldestProcessingAgeSeconds).toBe(7200)
    const search = await ops.count(parseKeyFilters({ key: 'order' }))
    expect(search).toMatchObject({ processing: 4, stale: 3, matching: 4 })
    expect((await ops.list(parseKeyFilters({ key: 'order' }))).keys).toHaveLength(search.matching)
  })

  test('a cursor walks every key once; a forged cursor and a bad filter are refused', async () => {
    const seen: string[] = []
    let cursor: string | undefined
    do {
      const page = await ops.list(parseKeyFilters({ tenant: 'list-b' }), { cursor, limit: 2 })
      seen.push(...page.keys.map((key) => key.key))
      cursor = page.nextCursor
    } while (cursor)
    expect(seen).toEqual(['odd%_key', 'order-9', 'order-1'])
    expect(ops.list(parseKeyFilters({}), { cursor: 'bm90LWEtY3Vyc29y' })).rejects.toBeInstanceOf(OperationInputError)
    expect(() => parseKeyFilters({ route: 'not a route' })).toThrow(OperationInputError)
    expect(ops.list(parseKeyFilters({}), { limit: 501 })).rejects.toBeInstanceOf(OperationInputError)
  })
})

describe('show', () => {
  test('a stuck key whose owner died: lease, attempts, owner gone, deadline passed, downstream key, would expire', async () => {
    const owner = crypto.randomUUID()
    await db.sql`insert into idempotency_processes (id, pid, hostname, started_at, heartbeat_at) values (${owner}, 4242, 'web-7', ${ago(9000)}, ${ago(600)})`
    await processing('show', 'dead-owner', 900)
    await db.sql`update idempotency_keys set owner = ${owner}, attempts = 2 where tenant = 'show' and key = 'dead-owner'`
    const detail = (await ops.show('show', 'dead-owner'))!
    const [row] = await db.sql<{ request_id: string; lease: string }[]>`select request_id::text, lease::text from idempotency_key_states where tenant = 'show' and key = 'dead-owner'`
    expect(detail).toMatchObject({ status: 'processing', method: 'POST', path: '/api/payments', attempts: 2, lease: row!.lease, stale: true, expirePreview: 'expire', requestId: row!.request_id })
    expect(detail.deadline).toEqual(secondsAfter(ago(900), TTL))
    expect(detail.owner).toMatchObject({ pid: 4242, hostname: 'web-7', alive: false, heartbeatAgeSeconds: 600 })
    expect(detail.downstreamKey).toBe(downstreamKey({ tenant: 'show', key: 'dead-owner', requestId: row!.request_id }))
    expect(detail.payment).toBeNull()
  })

  test('a key whose owner stopped cleanly: the stop, not the beat it dated back', async () => {
    const owner = crypto.randomUUID()
    await db.sql`insert into idempotency_processes (id, pid, hostname, heartbeat_at, stopped_at) values (${owner}, 4243, 'web-8', ${ago(15)}, ${ago(5)})`
    await processing('show', 'stopped-owner', 8)
    await db.sql`update idempotency_keys set owner = ${owner} where tenant = 'show' and key = 'stopped-owner'`
    const detail = (await ops.show('show', 'stopped-owner'))!
    expect(detail.owner).toMatchObject({ pid: 4243, alive: false, heartbeatAt: ago(5), heartbeatAgeSeconds: 5, stoppedAt: ago(5) })
    expect(ownerText(detail)).toBe('pid 4243 on web-8: stopped 5s ago (shut down cleanly before this request finished)')
    expect(detail.expirePreview).toBe('expire')
  })

  test('a young key whose owner beats would be refused; one whose owner row is gone would not', async () => {
    const owner = crypto.randomUUID()
    await db.sql`insert into idempotency_processes (id, pid, hostname, heartbeat_at) values (${owner}, 1, 'web-1', ${ago(1)})`
    await processing('show', 'alive-owner', 3)
    await db.sql`update idempotency_keys set owner = ${owner} where tenant = 'show' and key = 'alive-owner'`
    expect(await ops.show('show', 'alive-owner')).toMatchObject({ expirePreview: 'worker_alive', stale: false, owner: { alive: true, pid: 1 } })
    await db.sql`update idempotency_keys set owner = ${crypto.randomUUID()} where tenant = 'show' and key = 'alive-owner'`
    expect(await ops.show('show', 'alive-owner')).toMatchObject({ expirePreview: 'expire', owner: { alive: false, pid: null } })
  })

  test('a completed payment: its stored answer, and the payment it names (customer, amount, provider charge)', async () => {
    const [payment] = await db.sql<{ id: string }[]>`
      insert into payments (tenant, amount, currency, customer, status, provider_ref, idempotency_key)
      values ('show', 1250, 'EUR', 'cus_42', 'succeeded', 'ch_abc', 'paid-1') returning id::text`
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
      values ('show', 'paid-1', 'POST', '/api/payments', ${'d'.repeat(64)}, 'done', ${ago(100)}, ${ago(100)}, ${ago(99)}, 201, '{}'::jsonb, ${JSON.stringify({ id: payment!.id, amount: 1250 })})`
    const detail = (await ops.show('show', 'paid-1'))!
    expect(detail).toMatchObject({ status: 'done', expirePreview: 'not_processing', deadline: null, pastRetention: false, response: { status: 201, truncated: false } })
    expect(detail.retentionEndsAt).toEqual(secondsAfter(ago(99), RETENTION))
    expect(detail.payment).toMatchObject({ id: payment!.id, amount: '1250', currency: 'EUR', customer: 'cus_42', providerReference: 'ch_abc' })
    // Another key's answer naming that payment does not borrow it.
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
      values ('show', 'other', 'POST', '/api/payments', ${'d'.repeat(64)}, 'done', ${ago(100)}, ${ago(100)}, ${ago(99)}, 201, '{}'::jsonb, ${JSON.stringify({ id: payment!.id })})`
    expect((await ops.show('show', 'other'))!.payment).toBeNull()
    expect(await ops.show('show', 'no-such-key')).toBeUndefined()
  })
})

describe('actions record their audit entry, and act on the server\'s rules only', () => {
  test('force-expire: one entry, whatever the outcome', async () => {
    const lease = await processing('act', 'fx', 600)
    const before = await auditCount()
    expect((await ops.forceExpire({ tenant: 'act', key: 'fx', lease }, 'test:ops')).outcome).toBe('expired')
    expect((await ops.forceExpire({ tenant: 'act', key: 'fx', lease }, 'test:ops')).outcome).toBe('unchanged')
    expect(await auditCount()).toBe(before + 2)
    expect((await ops.show('act', 'fx'))!.status).toBe('released')
  })

  test('expire-stale: the preview names what the action then does, as of the preview', async () => {
    await processing('act-batch', 'old-1', 600)
    await processing('act-batch', 'old-2', 500)
    await processing('act-batch', 'young', 10)
    const preview = await ops.previewExpireStale('act-batch')
    expect(preview).toMatchObject({ stale: 2, tenant: 'act-batch', ttlSeconds: TTL })
    expect(preview.keys.map((key) => key.key)).toEqual(['old-1', 'old-2'])
    const before = await auditCount()
    const result = await ops.expireStale({ asOf: preview.asOf, tenant: 'act-batch' }, 'test:ops')
    expect(result).toMatchObject({ expired: 2, workerAlive: 0 })
    expect(await auditCount()).toBe(before + 3) // one per key, one for the action
  })

  test('purge deletes done and released keys past retention only, and records one entry', async () => {
    await createKey(db.sql, identity({ tenant: 'purge', key: 'done-old' }), { status: 'done', lockedAt: ago(RETENTION + 100), completedAt: ago(RETENTION + 1) })
    await createKey(db.sql, identity({ tenant: 'purge', key: 'done-live' }), { status: 'done', lockedAt: ago(RETENTION + 100), completedAt: ago(RETENTION - 1) })
    await released('purge', 'released-old', RETENTION + 1)
    // Claimed long ago but released just now: its retention counts from the release.
    await released('purge', 'released-now', 1)
    await db.sql`update idempotency_keys set created_at = ${ago(10 * RETENTION)}, locked_at = ${ago(10 * RETENTION)} where key = 'released-now'`
    const preview = await ops.previewPurge()
    expect(preview).toMatchObject({ done: 1, released: 1, retentionSeconds: RETENTION })
    const before = await auditCount()
    const result = await ops.purge('test:ops')
    expect(result.purged).toBe(2)
    expect(await auditCount()).toBe(before + 1)
    const left = await db.sql`select key from idempotency_key_states where tenant = 'purge' order by key`
    expect(left.map((row) => row.key)).toEqual(['done-live', 'released-now'])
  })
})

describe('audit', () => {
  test('filters by actor prefix, action, tenant and key; pages by id; one entry by id', async () => {
    const lease = await processing('aud', 'k1', 600)
    await ops.forceExpire({ tenant: 'aud', key: 'k1', lease }, 'admin:alice')
    await ops.forceExpire({ tenant: 'aud', key: 'k1', lease }, 'cli:bob')
    await ops.purge('cli:bob')
    const actions = async (filters: Parameters<typeof parseAuditFilters>[0]) => (await ops.audit(parseAuditFilters(filters))).entries.map((entry) => `${entry.actor} ${entry.action} ${entry.outcome}`)
    expect(await actions({ tenant: 'aud' })).toEqual(['cli:bob force_expire unchanged', 'admin:alice force_expire expired'])
    expect(await actions({ tenant: 'aud', actor: 'admin:' })).toEqual(['admin:alice force_expire expired'])
    expect((await actions({ actor: 'cli:bob', action: 'purge_expired' }))[0]).toBe('cli:bob purge_expired done')
    expect(await actions({ tenant: 'aud', key: 'k2' })).toEqual([])
    const first = await ops.audit({ ...parseAuditFilters({ tenant: 'aud' }), limit: 1 })
    expect(first.nextBefore).toBeDefined()
    const second = await ops.audit({ ...parseAuditFilters({ tenant: 'aud', before: first.nextBefore }), limit: 1 })
    expect(second.entries.map((entry) => entry.actor)).toEqual(['admin:alice'])
    expect(await ops.auditEntry(first.entries[0]!.id)).toMatchObject({ actor: 'cli:bob', tenant: 'aud', key: 'k1', detail: { lease } })
    expect(() => parseAuditFilters({ action: 'drop_table' })).toThrow(OperationInputError)
  })
})

const auditCount = async () => (await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_audit`)[0]!.n
