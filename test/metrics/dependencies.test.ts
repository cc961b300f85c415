/**
 * The dependencies as metrics (SPEC, metrics contract): each call to the
 * payment provider by outcome, the requests that ran into their deadline and
 * the keys released after it, the pools' connections in use and waiting, the
 * TTL the server runs with, and readiness. Values a wrong implementation
 * would get wrong: per attempt, not per charge; capped at the pool size;
 * the TTL as configured, not the default.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createMetrics, observePools } from '../../src/metrics/registry'
import { openPools } from '../../src/store/db'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, paymentRequest } from '../support/http'
import { startGatedProvider, type GatedProvider } from '../support/server'
import { waitFor } from '../support/wait'
import { DEFAULT_MAX_ATTEMPTS } from '../../src/provider/client'
import { sample } from './factories'

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('metrics_dependencies') })
afterAll(async () => { await db?.drop() })

const ROUTE = '/api/payments'
const apps: InProcessService[] = []
afterAll(async () => { for (const app of apps) await app.stop() })

async function app(options: Parameters<typeof startApp>[1]): Promise<InProcessService> {
  const started = await startApp(db, options)
  apps.push(started)
  return started
}

const text = (service: InProcessService) => service.metrics.registry.metrics()
const calls = async (service: InProcessService, outcome: string) => sample(await text(service), 'idempotency_provider_request_duration_seconds_count', { outcome })
const post = (service: InProcessService, body = payment()) => service.handle(paymentRequest(service.url, body))

describe('the provider call, by outcome, one observation per HTTP call', () => {
  test('ok: one per charge; every other outcome is there at 0 from the start', async () => {
    const service = await app({})
    for (const outcome of ['ok', 'failed', 'lost', 'deadline', 'aborted']) expect(await calls(service, outcome)).toBe(0)
    expect((await post(service)).status).toBe(201)
    expect((await post(service)).status).toBe(201)
    expect(await calls(service, 'ok')).toBe(2)
    expect(await calls(service, 'failed')).toBe(0)
  })

  test('failed: a refusal (5xx) is one call, not retried', async () => {
    const service = await app({ faults: { failureRate: 1 } })
    expect((await post(service)).status).toBe(502)
    expect(await calls(service, 'failed')).toBe(1)
    expect(await calls(service, 'ok')).toBe(0)
  })

  test('lost: every lost answer is a call of its own (the client retries it with the same key)', async () => {
    const service = await app({ faults: { lostResponseRate: 1 } })
    expect((await post(service)).status).toBe(502)
    expect(await calls(service, 'lost')).toBe(DEFAULT_MAX_ATTEMPTS)
  })

  test('deadline: the call stopped by the request\'s deadline, timed to it; counted as a deadline hit and a release with reason deadline', async () => {
    const provider: GatedProvider = await startGatedProvider()
    try {
      // TTL 1 s: the deadline is 800 ms after the claim (policy.ts: a margin of 200 ms).
      const service = await app({ provider, env: { IDEMPOTENCY_TTL_SECONDS: '1', IDEMPOTENCY_RETENTION_SECONDS: '60' } })
      provider.hold(1)
      const response = await post(service)
      expect(response.status).toBe(504)
      // The 504 answers at the deadline; the call's own end (Bun's HTTP client giving up the socket) is observed a tick
      // or more later: on a busy machine after the answer was read.
      await waitFor(async () => (await calls(service, 'deadline')) === 1, 'the call stopped by the deadline to be observed')
      const exposition = await text(service)
      const seconds = sample(exposition, 'idempotency_provider_request_duration_seconds_sum', { outcome: 'deadline' })!
      expect(seconds).toBeGreaterThan(0.6)
      expect(seconds).toBeLessThan(3) // stopped at the deadline, not when the held charge was let go (never, here)
      expect(sample(exposition, 'idempotency_deadline_exceeded_total', { route: ROUTE })).toBe(1)
      expect(sample(exposition, 'idempotency_releases_total', { route: ROUTE, reason: 'deadline' })).toBe(1)
      expect(sample(exposition, 'idempotency_releases_total', { route: ROUTE, reason: 'failed' })).toBe(0)
      // and the TTL gauge says 1, the configured value, not the 30 s default
      expect(sample(exposition, 'idempotency_ttl_seconds')).toBe(1)
    } finally {
      provider.release()
      await provider.stop()
    }
  })

  test('a failure that is not a deadline is released with reason failed, and is no deadline hit', async () => {
    const service = await app({ faults: { failureRate: 1 } })
    expect((await post(service)).status).toBe(502)
    const exposition = await text(service)
    expect(sample(exposition, 'idempotency_releases_total', { route: ROUTE, reason: 'failed' })).toBe(1)
    expect(sample(exposition, 'idempotency_deadline_exceeded_total', { route: ROUTE })).toBe(0)
  })
})

describe('readiness and the TTL', () => {
  test('idempotency_ready follows the database probe; idempotency_ttl_seconds is the configured TTL', async () => {
    const up = await app({ env: { IDEMPOTENCY_TTL_SECONDS: '7' } })
    expect(sample(await text(up), 'idempotency_ready')).toBe(1)
    expect(sample(await text(up), 'idempotency_ttl_seconds')).toBe(7)
    const health = { up: false }
    const away = await app({ health })
    expect(sample(await text(away), 'idempotency_ready')).toBe(0)
    health.up = true
    expect(sample(await text(away), 'idempotency_ready')).toBe(1) // read at each scrape, not frozen
  })
})

describe('the pools: connections in use and waiting', () => {
  test('in use is capped at the pool size and the rest wait; a transaction and a reservation each hold one; all back to 0 after', async () => {
    const pools = openPools(db.url, { applicationName: 'test:pool-usage', shortMax: 2, workMax: 1 })
    const metrics = createMetrics()
    observePools(metrics, pools.usage!)
    const read = async () => {
      const exposition = await metrics.registry.metrics()
      return {
        shortInUse: sample(exposition, 'idempotency_db_pool_connections_in_use', { pool: 'short' }),
        shortWaiting: sample(exposition, 'idempotency_db_pool_waiting', { pool: 'short' }),
        workInUse: sample(exposition, 'idempotency_db_pool_connections_in_use', { pool: 'work' }),
        workWaiting: sample(exposition, 'idempotency_db_pool_waiting', { pool: 'work' }),
        shortMax: sample(exposition, 'idempotency_db_pool_connections_max', { pool: 'short' }),
      }
    }
    try {
      // A fragment built into a query is never executed on its own: it must not count (nor stay counted).
      const fragment = pools.short`and true`
      await pools.short`select 1 where true ${fragment}`
      expect(await read()).toEqual({ shortInUse: 0, shortWaiting: 0, workInUse: 0, workWaiting: 0, shortMax: 2 })

      // Three statements that each hold a connection for a while on a pool of two: two run, one waits.
      const gate = await db.sql.reserve()
      await gate`select pg_advisory_lock(20020)`
      const blocked = [1, 2, 3].map(() => pools.short`select pg_advisory_lock_shared(20020)`.then(() => pools.short`select pg_advisory_unlock_shared(20020)`))
      const tx = pools.work.begin(async (sql) => { await sql`select pg_advisory_lock_shared(20020)`; await sql`select pg_advisory_unlock_shared(20020)` })
      await waitFor(async () => (await read()).shortInUse === 2, 'two statements to run on the short pool')
      expect(await read()).toEqual({ shortInUse: 2, shortWaiting: 1, workInUse: 1, workWaiting: 0, shortMax: 2 })
      // A reservation (what a completion holds) while the transaction holds the only work connection: it waits.
      const reserving = pools.work.reserve()
      await waitFor(async () => (await read()).workWaiting === 1, 'the reservation to wait')
      await gate`select pg_advisory_unlock(20020)`
      gate.release()
      await Promise.all([...blocked, tx])
      const reserved = await reserving
      expect(await read()).toMatchObject({ workInUse: 1, workWaiting: 0, shortInUse: 0, shortWaiting: 0 })
      reserved.release()
      expect(await read()).toEqual({ shortInUse: 0, shortWaiting: 0, workInUse: 0, workWaiting: 0, shortMax: 2 })
      // A failing statement is released too.
      await pools.short`select 1/0`.catch(() => undefined)
      expect((await read()).shortInUse).toBe(0)
    } finally {
      await pools.close()
    }
  })
})
