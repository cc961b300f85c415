/**
 * Force-expire must not rob a live worker, must not race a completion, and
 * must be conditional on what the operator saw; fencing covers the rest.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { expireStaleAction, forceExpireAction, type ActionContext } from '../../src/admin/actions'
import { claim } from '../../src/core/claim'
import { LeaseLostError } from '../../src/core/errors'
import { runWithLease } from '../../src/core/lease'
import { reclaim } from '../../src/core/reclaim'
import type { Lease, StoredResponse } from '../../src/core/types'
import { createMetrics, type Metrics } from '../../src/metrics/registry'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { identity } from '../support/keys'
import { startServer, type ServerProcess } from '../support/server'
import { api, keyExists, postForm, signIn, stuckKey } from './support'

const TTL = 30
const OK: StoredResponse = { status: 201, headers: { 'content-type': 'application/json' }, body: '{"ok":true}' }

let db: TestDatabase
let metrics: Metrics
let context: ActionContext
beforeAll(async () => {
  db = await createTestDatabase('admin_expire')
  await db.sql`create table side_effects (key text not null, lease text not null)`
  metrics = createMetrics()
  context = { sql: db.pools.short, metrics, ttlSeconds: TTL, retentionSeconds: 3600 }
})
afterAll(() => db?.drop())

const counter = async (outcome: string) =>
  (await metrics.forcedExpirations.get()).values.find((value) => value.labels.outcome === outcome)?.value ?? 0

/**
 * True once a worker has locked its processing key: the lock writes its
 * transaction id into the row's xmax. A read-only probe; a probing lock of our
 * own would make the worker's NOWAIT fail.
 */
async function rowLocked(key: string): Promise<boolean> {
  const [row] = await db.sql`select xmax::text <> '0' as locked from idempotency_keys where key = ${key} and status = 'processing'`
  return row?.locked === true
}

async function waitFor(check: () => Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await check()) return
    await Bun.sleep(10)
  }
  throw new Error(`timed out waiting for ${what}`)
}

async function claimed(id = identity()): Promise<Lease> {
  const result = await claim(db.pools.short, id, { ttlSeconds: TTL, retentionSeconds: 3600 })
  if (result.kind !== 'created') throw new Error(`expected created, got ${result.kind}`)
  return result.lease
}

function complete(lease: Lease, before: () => Promise<void> = async () => undefined) {
  return runWithLease(db.pools.work, db.pools.short, lease, async (tx) => {
    await before()
    await tx`insert into side_effects (key, lease) values (${lease.key}, ${lease.lease})`
    return OK
  })
}

const sideEffects = async (key: string) => (await db.sql<{ n: number }[]>`select count(*)::int as n from side_effects where key = ${key}`)[0]!.n

describe('against a live worker (real server, slow provider)', () => {
  let server: ServerProcess
  beforeAll(async () => {
    server = await startServer(db.url, { PAYMENT_PROVIDER_DELAY_MS: '3000', IDEMPOTENCY_TTL_SECONDS: '1' })
  })
  afterAll(() => server?.stop())

  test('force-expire is refused from the API and the page while the worker holds the key, and the payment completes', async () => {
    const key = `live-${crypto.randomUUID()}`
    const request = postPayment(server.url, payment(), { key })
    await waitFor(() => rowLocked(key), 'the worker to lock its key')
    const [row] = await db.sql<{ lease: string }[]>`select lease from idempotency_keys where key = ${key}`
    await Bun.sleep(1100) // past the TTL of 1 s: the key now shows as stale, yet its worker is alive

    const viaApi = await api(server.url, '/admin/api/keys/expire', { method: 'POST', body: { tenant: 'acme', key, lease: row!.lease } })
    expect(viaApi.status).toBe(409)
    expect(await viaApi.json()).toMatchObject({ code: 'worker-alive', outcome: 'worker_alive' })

    const admin = await signIn(server.url)
    const viaPage = await postForm(server.url, '/admin/keys/expire', { csrf: admin.csrf, tenant: 'acme', key, lease: row!.lease }, { cookie: admin.cookie })
    expect(viaPage.status).toBe(303)
    const notice = await (await fetch(`${server.url}${viaPage.headers.get('location')}`, { headers: { cookie: admin.cookie } })).text()
    expect(notice).toContain('Not expired: a live worker holds this key')

    const viaStale = await api(server.url, '/admin/api/keys/expire-stale', { method: 'POST', body: {} })
    expect(await viaStale.json()).toMatchObject({ expired: 0, worker_alive: 1, worker_alive_keys: [{ tenant: 'acme', key }] })

    const answer = await request
    expect(answer.status).toBe(201)
    const [done] = await db.sql`select status from idempotency_keys where key = ${key}`
    expect(done!.status).toBe('done')
    const [paid] = await db.sql`select count(*)::int as n from payments where idempotency_key = ${key}`
    expect(paid!.n).toBe(1)

    // Now it completed: the lease the operator saw is no longer in processing.
    const late = await api(server.url, '/admin/api/keys/expire', { method: 'POST', body: { tenant: 'acme', key, lease: row!.lease } })
    expect(late.status).toBe(409)
    expect(await late.json()).toMatchObject({ code: 'key-changed' })

    const audit = await db.sql`select actor, outcome from idempotency_audit where key = ${key} order by id`
    expect(audit.map((entry) => entry.outcome)).toEqual(['worker_alive', 'worker_alive', 'unchanged'])
    expect(audit[0]!.actor).toBe('api')
    expect(audit[1]!.actor).toBe('admin:alice')
    const exposition = await (await fetch(`${server.url}/metrics`)).text()
    expect(exposition).toMatch(/idempotency_forced_expirations_total\{outcome="worker_alive"\} 3/)
  }, 20_000)

  test('a dead worker\'s key is expired from the page, and the client\'s retry then runs afresh', async () => {
    const key = `dead-${crypto.randomUUID()}`
    const lease = await stuckKey(db.sql, 'acme', key, 120)
    const admin = await signIn(server.url)
    const response = await postForm(server.url, '/admin/keys/expire', { csrf: admin.csrf, tenant: 'acme', key, lease }, { cookie: admin.cookie })
    expect(response.status).toBe(303)
    expect(await keyExists(db.sql, 'acme', key)).toBe(false)
    const retry = await postPayment(server.url, payment(), { key })
    expect(retry.status).toBe(201)
    const exposition = await (await fetch(`${server.url}/metrics`)).text()
    expect(exposition).toMatch(/idempotency_forced_expirations_total\{outcome="expired"\} 1/)
  }, 20_000)
})

describe('conditional on what the operator saw', () => {
  test('a key reclaimed since (new lease) is left to its new owner', async () => {
    const id = identity()
    const first = await claimed(id)
    await db.sql`update idempotency_keys set locked_at = now() - interval '1 hour' where key = ${id.key}`
    const taken = await reclaim(db.pools.short, first, { ttlSeconds: TTL, retentionSeconds: 3600 })
    expect(taken && taken !== 'busy').toBe(true)
    const result = await forceExpireAction(context, { tenant: id.tenant, key: id.key, lease: first.lease }, 'test')
    expect(result.outcome).toBe('unchanged')
    const [row] = await db.sql`select lease from idempotency_keys where key = ${id.key}`
    expect(row!.lease).toBe((taken as Lease).lease)
  })

  test('expire-all-stale acts only on keys already stale when the operator confirmed', async () => {
    const before = await counter('expired')
    const dead = await stuckKey(db.sql, 'conf', `old-${crypto.randomUUID()}`, 3600)
    const recentKey = `recent-${crypto.randomUUID()}`
    await stuckKey(db.sql, 'conf', recentKey, 60) // stale now (TTL 30), but not yet 45 s ago
    const result = await expireStaleAction(context, { tenant: 'conf', asOf: new Date(Date.now() - 45_000) }, 'test')
    expect(result.expired).toBe(1)
    expect(await keyExists(db.sql, 'conf', recentKey)).toBe(true)
    expect(await counter('expired')).toBe(before + 1)
    expect(dead).toBeTruthy()
  })
})

describe('races with the worker', () => {
  test('a key expired before its worker locked it: the worker is fenced off and commits nothing', async () => {
    const lease = await claimed()
    const result = await forceExpireAction(context, lease, 'test')
    expect(result.outcome).toBe('expired')
    await expect(complete(lease)).rejects.toBeInstanceOf(LeaseLostError)
    expect(await sideEffects(lease.key)).toBe(0)
  })

  test('force-expire at the moment of completion: either the worker committed and nothing was expired, or nothing committed', async () => {
    const outcomes = new Map<string, number>()
    for (let round = 0; round < 40; round++) {
      const lease = await claimed()
      let go!: () => void
      const gate = new Promise<void>((resolve) => { go = resolve })
      const worker = complete(lease, () => gate).then(() => 'committed', (error: unknown) => (error instanceof LeaseLostError ? 'fenced' : `error ${String(error)}`))
      // Spread the expire over the worker's start, its lock, and its commit.
      const delay = round % 4 === 0 ? 0 : Math.random() * 6
      setTimeout(go, round % 2 === 0 ? 0 : 3)
      await Bun.sleep(delay)
      const expire = (await forceExpireAction(context, lease, 'test')).outcome
      const work = await worker
      const effects = await sideEffects(lease.key)
      const [row] = await db.sql`select status from idempotency_keys where key = ${lease.key}`
      outcomes.set(`${expire}/${work}`, (outcomes.get(`${expire}/${work}`) ?? 0) + 1)
      if (expire === 'expired') {
        expect({ work, effects, row }).toEqual({ work: 'fenced', effects: 0, row: undefined })
      } else {
        expect({ expire, work, effects, status: row?.status }).toEqual({ expire, work: 'committed', effects: 1, status: 'done' })
        expect(['worker_alive', 'unchanged']).toContain(expire)
      }
    }
    console.log('force-expire vs completion outcomes:', Object.fromEntries(outcomes))
    expect(outcomes.size).toBeGreaterThan(1)
  }, 30_000)

  test('expire-all-stale skips and reports keys that live workers hold, and expires the rest', async () => {
    const tenant = `batch-${crypto.randomUUID().slice(0, 8)}`
    const deadKeys = await Promise.all(Array.from({ length: 250 }, (_, i) => stuckKey(db.sql, tenant, `dead-${i}`, 600)))
    expect(deadKeys).toHaveLength(250)
    await stuckKey(db.sql, tenant, 'held-by-worker', 600)
    await stuckKey(db.sql, tenant, 'fresh', 1)
    // A live worker: a transaction holding the row FOR UPDATE, as lease.ts does.
    const worker = await db.sql.reserve()
    await worker`begin`
    await worker`select 1 from idempotency_keys where tenant = ${tenant} and key = 'held-by-worker' for update`
    try {
      const result = await expireStaleAction(context, { tenant }, 'test')
      expect(result.expired).toBe(250)
      expect(result.workerAlive).toBe(1)
      expect(result.aliveKeys).toEqual([{ tenant, key: 'held-by-worker' }])
    } finally {
      await worker`rollback`
      worker.release()
    }
    const left = await db.sql`select key from idempotency_keys where tenant = ${tenant} order by key`
    expect(left.map((row) => row.key)).toEqual(['fresh', 'held-by-worker'])
    const [audit] = await db.sql`select count(*)::int as n from idempotency_audit where tenant = ${tenant} and action = 'force_expire' and outcome = 'expired'`
    expect(audit!.n).toBe(250)
    const [summary] = await db.sql`select detail from idempotency_audit where tenant = ${tenant} and action = 'expire_all_stale'`
    expect(summary!.detail).toMatchObject({ expired: 250, worker_alive: 1 })
  })
})
