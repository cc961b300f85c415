/**
 * idempotentFetch against the live service (its app served on a real socket
 * in this process: real HTTP, real PostgreSQL, a real provider simulator)
 * with faults injected: connections dropped before and after the
 * server did the work, a failing provider, a provider slower than the
 * client's patience. Every check counts payments in the database: exactly one
 * per logical operation.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { idempotentFetch, type IdempotentFetchOptions, type RetryEvent } from '../../src/client'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startApp, type AppOptions, type InProcessService } from '../support/app'
import { payment } from '../support/http'
import { startFaultProxy } from './fault-proxy'

let db: TestDatabase
const servers: InProcessService[] = []
beforeAll(async () => {
  db = await createTestDatabase('client_live')
})
afterAll(async () => {
  await Promise.all(servers.map((server) => server.stop()))
  await db?.drop()
})

/** The service listening on a free port; no process boundary is under test here, only HTTP. */
async function server(options: AppOptions = {}): Promise<{ url: string }> {
  const started = await startApp(db, options)
  servers.push(started)
  return { url: started.listen() }
}

interface Operation {
  key: string
  customer: string
  status: number
  paymentId: string
  replayed: boolean
  retries: RetryEvent[]
}

/** One logical payment, sent with the helper until it has a final answer. */
async function pay(baseUrl: string, customer: string, options: IdempotentFetchOptions): Promise<Operation> {
  const key = `op-${crypto.randomUUID()}`
  const retries: RetryEvent[] = []
  const response = await idempotentFetch(`${baseUrl}/api/payments`, {
    headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json' },
    body: JSON.stringify(payment({ customer })),
  }, { key, onRetry: (event) => retries.push(event), ...options })
  const body = await response.json() as { id: string }
  return { key, customer, status: response.status, paymentId: body.id, replayed: response.headers.get('idempotent-replayed') === 'true', retries }
}

/** Payments per idempotency key, for the given keys. */
async function paymentsPerKey(keys: string[]): Promise<Map<string, string[]>> {
  const rows = await db.sql<{ idempotency_key: string; id: string }[]>`
    select idempotency_key, id from payments where tenant = 'acme' and idempotency_key in ${db.sql(keys)}`
  const byKey = new Map<string, string[]>(keys.map((key) => [key, []]))
  for (const row of rows) byKey.get(row.idempotency_key)!.push(row.id)
  return byKey
}

async function expectExactlyOnce(operations: Operation[]): Promise<void> {
  expect(operations.every((op) => op.status === 201)).toBe(true)
  const byKey = await paymentsPerKey(operations.map((op) => op.key))
  for (const op of operations) expect(byKey.get(op.key)).toEqual([op.paymentId])
}

/** Fast retries for tests: the policy is the same, only the scale is smaller. */
const QUICK = { baseDelayMs: 5, maxDelayMs: 50, deadlineMs: 20_000 } as const

describe('idempotentFetch against the live service', () => {
  test('dropped connections, before and after the server did the work: one payment per operation', async () => {
    const live = await server()
    // The first 40 connections fail, alternating: refused at once, or cut after the request went through.
    const proxy = await startFaultProxy(live.url, (index) => (index >= 40 ? 'pass' : index % 2 === 0 ? 'refuse' : 'cut'))
    try {
      const operations = await Promise.all(Array.from({ length: 12 }, (_, i) =>
        pay(proxy.url, `cus_drop_${i}`, { ...QUICK, maxAttempts: 30, fetch: (url, init) => fetch(url, { ...init, keepalive: false }) })))
      expect(proxy.counts.refuse).toBeGreaterThan(0)
      expect(proxy.cutAnswers()).toBeGreaterThan(0)
      await expectExactlyOnce(operations)
      // An answer cut after the payment committed can only have been recovered by a replay.
      expect(operations.filter((op) => op.replayed).length).toBeGreaterThan(0)
      expect(operations.some((op) => op.retries.some((r) => r.error !== undefined))).toBe(true)
    } finally {
      proxy.stop()
    }
  })

  test('a provider that fails 60% of the time: released keys are retried to exactly one payment each', async () => {
    const live = await server({ faults: { failureRate: 0.6 } })
    // 0.6^30 ≈ 2e-7: no operation runs out of attempts by bad luck.
    const operations = await Promise.all(Array.from({ length: 15 }, (_, i) => pay(live.url, `cus_fail_${i}`, { ...QUICK, maxAttempts: 30 })))
    const failures = operations.flatMap((op) => op.retries).filter((r) => r.status === 502).length
    expect(failures).toBeGreaterThan(0)
    await expectExactlyOnce(operations)
  })

  test('a provider slower than the client’s patience: 409s, then the one payment', async () => {
    // TTL 2 s keeps Retry-After short; the provider takes 600 ms, each attempt waits only 150 ms.
    const live = await server({ faults: { delayMs: 600 }, env: { IDEMPOTENCY_TTL_SECONDS: '2' } })
    const operations = await Promise.all(Array.from({ length: 8 }, (_, i) =>
      pay(live.url, `cus_slow_${i}`, { ...QUICK, maxAttempts: 50, attemptTimeoutMs: 150, maxRetryAfterMs: 100 })))
    const conflicts = operations.flatMap((op) => op.retries).filter((r) => r.status === 409)
    expect(conflicts.length).toBeGreaterThan(0)
    // The first attempt of each timed out on the client, yet the server finished it: the final answer is its replay.
    expect(operations.every((op) => op.replayed)).toBe(true)
    await expectExactlyOnce(operations)
  })

  test('a 422 is final: the same key for another body is not retried', async () => {
    const live = await server()
    const key = `op-${crypto.randomUUID()}`
    const init = (customer: string) => ({
      headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json' },
      body: JSON.stringify(payment({ customer })),
    })
    const retries: RetryEvent[] = []
    expect((await idempotentFetch(`${live.url}/api/payments`, init('cus_a'), { key })).status).toBe(201)
    const reused = await idempotentFetch(`${live.url}/api/payments`, init('cus_b'), { key, onRetry: (event) => retries.push(event) })
    expect(reused.status).toBe(422)
    expect(reused.headers.get('content-type')).toContain('application/problem+json')
    expect(retries).toHaveLength(0)
    expect((await paymentsPerKey([key])).get(key)).toHaveLength(1)
  })
})
