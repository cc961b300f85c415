/**
 * Force-expire must not take a key from a worker that is alive and within its
 * deadline, must not race a completion, and must be conditional on what the
 * operator saw; fencing covers an operator who is wrong.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { fingerprint } from '../../src/core/fingerprint'
import { LeaseLostError } from '../../src/core/errors'
import { PROCESS_ALIVE_SECONDS } from '../../src/core/processes'
import { reclaim } from '../../src/core/reclaim'
import type { Lease, StoredResponse } from '../../src/core/types'
import { operations, type Operations, type OperationsContext } from '../../src/operations'
import { backdateLease, createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { identity } from '../support/keys'
import { startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { waitFor } from '../support/wait'
import { api, keyInProcessing, postForm, signIn, stuckKey } from './support'

const TTL = 30
const OK: StoredResponse = { status: 201, headers: { 'content-type': 'application/json' }, body: '{"ok":true}' }

let db: TestDatabase
let context: OperationsContext
let ops: Operations
beforeAll(async () => {
  db = await createTestDatabase('admin_expire')
  await db.sql`create table side_effects (key text not null, lease text not null)`
  context = { sql: db.pools.short, ttlSeconds: TTL, retentionSeconds: 3600 }
  ops = operations(context)
})
afterAll(() => db?.drop())

async function claimed(id = identity(), owner?: string): Promise<Lease> {
  const result = await claim(db.pools.short, id, { ttlSeconds: TTL, retentionSeconds: 3600, owner })
  if (result.kind !== 'created') throw new Error(`expected created, got ${result.kind}`)
  return result.lease
}

function finish(lease: Lease, before: () => Promise<void> = async () => undefined) {
  return complete(db.pools.work, lease, async (tx) => {
    await before()
    await tx`insert into side_effects (key, lease) values (${lease.key}, ${lease.lease})`
    return OK
  })
}

/** A process row as a server writes it, with its last heartbeat `ageSeconds` ago. */
async function processRow(ageSeconds: number): Promise<string> {
  const id = crypto.randomUUID()
  await db.sql`insert into idempotency_processes (id, pid, hostname, heartbeat_at) values (${id}, 1, 'test', now() - make_interval(secs => ${ageSeconds}))`
  return id
}

const sideEffects = async (key: string) => (await db.sql<{ n: number }[]>`select count(*)::int as n from side_effects where key = ${key}`)[0]!.n
const statusOf = async (key: string) => (await db.sql<{ status: string }[]>`select status from idempotency_key_states where key = ${key}`)[0]?.status

describe('against a live worker (real server, a provider call held open by the test)', () => {
  let server: ServerProcess
  let provider: GatedProvider
  beforeAll(async () => {
    provider = await startGatedProvider()
    server = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: '20' }, { provider })
  })
  afterAll(async () => {
    await server?.stop()
    await provider?.stop()
  })

  test('force-expire is refused from the API and the page while the worker is alive and within its deadline; the payment completes', async () => {
    const key = `live-${crypto.randomUUID()}`
    provider.hold(1)
    const request = postPayment(server.url, payment(), { key })
    // The worker is in its external phase: the provider holds its charge until released below.
    await waitFor(async () => provider.held() === 1, 'the charge to reach the provider')
    const [row] = await db.sql<{ lease: string }[]>`select lease from idempotency_key_states where key = ${key}`

    const viaApi = await api(server.url, '/admin/api/keys/expire', { method: 'POST', body: { tenant: 'acme', key, lease: row!.lease } })
    expect(viaApi.status).toBe(409)
    expect(await viaApi.json()).toMatchObject({ code: 'worker-alive', outcome: 'worker_alive' })

    const admin = await signIn(server.url)
    const viaPage = await postForm(server.url, '/admin/keys/expire', { csrf: admin.csrf, tenant: 'acme', key, lease: row!.lease }, { cookie: admin.cookie })
    expect(viaPage.status).toBe(303)
    const notice = await (await fetch(`${server.url}${viaPage.headers.get('location')}`, { headers: { cookie: admin.cookie } })).text()
    expect(notice).toContain('Not expired: a live worker holds this key')

    // Not stale yet (TTL 20 s), so expire-all-stale does not touch it either.
    const viaStale = await api(server.url, '/admin/api/keys/expire-stale', { method: 'POST', body: {} })
    expect(await viaStale.json()).toMatchObject({ expired: 0 })

    provider.release()
    const answer = await request
    expect(answer.status).toBe(201)
    expect(await statusOf(key)).toBe('done')
    const [paid] = await db.sql`select count(*)::int as n from payments where idempotency_key = ${key}`
    expect(paid!.n).toBe(1)

    // Now it completed: the lease the operator saw is no longer in processing.
    const late = await api(server.url, '/admin/api/keys/expire', { method: 'POST', body: { tenant: 'acme', key, lease: row!.lease } })
    expect(late.status).toBe(409)
    expect(await late.json()).toMatchObject({ code: 'key-changed' })

    const audit = await db.sql`select actor, outcome from idempotency_audit where key = ${key} order by id`
    expect(audit.map((entry) => entry.outcome)).toEqual(['worker_alive', 'worker_alive', 'unchanged'])
    expect(audit[0]!.actor).toBe('api:admin')
    expect(audit[1]!.actor).toBe('admin:admin')
  }, 20_000)

  test('a dead worker\'s key is expired from the page, and the client\'s retry then runs afresh; another body stays refused', async () => {
    const key = `dead-${crypto.randomUUID()}`
    const lease = await stuckKey(db.sql, 'acme', key, 120, '/api/payments', fingerprint('POST', '/api/payments', payment()))
    const admin = await signIn(server.url)
    const response = await postForm(server.url, '/admin/keys/expire', { csrf: admin.csrf, tenant: 'acme', key, lease }, { cookie: admin.cookie })
    expect(response.status).toBe(303)
    expect(await keyInProcessing(db.sql, 'acme', key)).toBe(false)
    // The released key stays bound to its request: an edited body would be a second charge.
    expect((await postPayment(server.url, payment({ description: 'edited' }), { key })).status).toBe(422)
    const retry = await postPayment(server.url, payment(), { key })
    expect(retry.status).toBe(201)
  }, 20_000)
})

describe('who counts as alive', () => {
  test('before its deadline, a key whose owner beats is refused; one whose owner stopped beating is expired', async () => {
    const alive = await claimed(identity(), await processRow(0))
    expect((await ops.forceExpire(alive, 'test')).outcome).toBe('worker_alive')
    expect(await statusOf(alive.key)).toBe('processing')

    const gone = await claimed(identity(), await processRow(PROCESS_ALIVE_SECONDS + 5))
    expect((await ops.forceExpire(gone, 'test')).outcome).toBe('expired')
    expect(await statusOf(gone.key)).toBe('released')
  })

  test('a key whose claimer has no heartbeat row is taken for alive until its deadline', async () => {
    const unknown = await claimed()
    expect((await ops.forceExpire(unknown, 'test')).outcome).toBe('worker_alive')
  })

  test('past its deadline a key is expired even if its owner still beats: that worker has stopped', async () => {
    const lease = await claimed(identity(), await processRow(0))
    await backdateLease(db.sql, lease.key, TTL + 1)
    expect((await ops.forceExpire(lease, 'test')).outcome).toBe('expired')
    // And if it had not stopped, it could not commit.
    await expect(finish(lease)).rejects.toBeInstanceOf(LeaseLostError)
    expect(await sideEffects(lease.key)).toBe(0)
  })
})

describe('conditional on what the operator saw', () => {
  test('a key reclaimed since (new lease) is left to its new owner', async () => {
    const id = identity()
    const first = await claimed(id)
    await backdateLease(db.sql, id.key, 3600)
    const taken = await reclaim(db.pools.short, first, { ttlSeconds: TTL, retentionSeconds: 3600 })
    if (taken === null || taken === 'busy') throw new Error(`expected a reclaim, got ${taken}`)
    const result = await ops.forceExpire({ tenant: id.tenant, key: id.key, lease: first.lease }, 'test')
    expect(result.outcome).toBe('unchanged')
    const [row] = await db.sql`select lease, status from idempotency_key_states where key = ${id.key}`
    expect(row).toMatchObject({ lease: taken.lease, status: 'processing' })
  })

  test('expire-all-stale acts only on keys already stale when the operator confirmed', async () => {
    const deadKey = `old-${crypto.randomUUID()}`
    await stuckKey(db.sql, 'conf', deadKey, 3600)
    const recentKey = `recent-${crypto.randomUUID()}`
    await stuckKey(db.sql, 'conf', recentKey, 60) // stale now (TTL 30), but not yet 45 s ago
    const result = await ops.expireStale({ tenant: 'conf', asOf: new Date(Date.now() - 45_000) }, 'test')
    expect(result.expired).toBe(1)
    expect(result.expiredKeys).toEqual([{ tenant: 'conf', key: deadKey }])
    expect(await keyInProcessing(db.sql, 'conf', recentKey)).toBe(true)
    expect(await keyInProcessing(db.sql, 'conf', deadKey)).toBe(false)
  })
})

describe('races with the worker', () => {
  test('a key expired before its worker completes: the worker is fenced off and commits nothing', async () => {
    const lease = await claimed(identity(), await processRow(PROCESS_ALIVE_SECONDS + 5))
    const result = await ops.forceExpire(lease, 'test')
    expect(result.outcome).toBe('expired')
    await expect(finish(lease)).rejects.toBeInstanceOf(LeaseLostError)
    expect(await sideEffects(lease.key)).toBe(0)
  })

  test('force-expire at the moment of completion: either the worker committed and nothing was expired, or nothing committed', async () => {
    // The operator acts as if past the deadline, so every attempt is a real race with the COMMIT.
    const late = operations({ ...context, now: () => new Date(Date.now() + 2 * TTL * 1000) })
    const outcomes = new Map<string, number>()
    for (let round = 0; round < 40; round++) {
      const lease = await claimed()
      let go!: () => void
      const gate = new Promise<void>((resolve) => { go = resolve })
      const worker = finish(lease, () => gate).then(() => 'committed', (error: unknown) => (error instanceof LeaseLostError ? 'fenced' : `error ${String(error)}`))
      // Spread the expire over the worker's writes and its commit.
      setTimeout(go, round % 2 === 0 ? 0 : 3)
      await Bun.sleep(round % 4 === 0 ? 0 : Math.random() * 6)
      const expire = (await late.forceExpire(lease, 'test')).outcome
      const work = await worker
      const effects = await sideEffects(lease.key)
      const status = await statusOf(lease.key)
      outcomes.set(`${expire}/${work}`, (outcomes.get(`${expire}/${work}`) ?? 0) + 1)
      if (expire === 'expired') {
        expect({ work, effects, status }).toEqual({ work: 'fenced', effects: 0, status: 'released' })
      } else {
        expect({ expire, work, effects, status }).toEqual({ expire, work: 'committed', effects: 1, status: 'done' })
        expect(['worker_alive', 'unchanged']).toContain(expire)
      }
    }
    console.log('force-expire vs completion outcomes:', Object.fromEntries(outcomes))
  }, 30_000)

  test('expire-all-stale skips and reports keys whose completion is committing, and expires the rest', async () => {
    const tenant = `batch-${crypto.randomUUID().slice(0, 8)}`
    await Promise.all(Array.from({ length: 250 }, (_, i) => stuckKey(db.sql, tenant, `dead-${i}`, 600)))
    await stuckKey(db.sql, tenant, 'committing', 600)
    await stuckKey(db.sql, tenant, 'fresh', 1)
    // A completion in flight holds its row for the round trip of its fence and COMMIT.
    const completion = await db.sql.reserve()
    await completion`begin`
    await completion`select 1 from idempotency_keys where tenant = ${tenant} and key = 'committing' for update`
    try {
      const result = await ops.expireStale({ tenant }, 'test')
      expect(result.expired).toBe(250)
      expect(result.workerAlive).toBe(1)
      expect(result.aliveKeys).toEqual([{ tenant, key: 'committing' }])
    } finally {
      await completion`rollback`
      completion.release()
    }
    const left = await db.sql`select key from idempotency_key_states where tenant = ${tenant} and status = 'processing' order by key`
    expect(left.map((row) => row.key)).toEqual(['committing', 'fresh'])
    const [audit] = await db.sql`select count(*)::int as n from idempotency_audit where tenant = ${tenant} and action = 'force_expire' and outcome = 'expired'`
    expect(audit!.n).toBe(250)
    const [summary] = await db.sql`select detail from idempotency_audit where tenant = ${tenant} and action = 'expire_all_stale'`
    expect(summary!.detail).toMatchObject({ expired: 250, worker_alive: 1 })
  })
})
