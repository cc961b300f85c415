/**
 * The bench's second yardstick, the naive check-then-insert, exists only with
 * BENCH_BASELINE_ROUTE=1, replays a completed key like the articles' design
 * does, and is broken the way that design is: a storm of one key makes a
 * payment per request. If that ever stops (a lock or a claim slipped in), the
 * bench no longer compares against "doing it wrong".
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { loadConfig } from '../../src/config'
import { createMetrics } from '../../src/metrics/registry'
import { BENCH_NAIVE_ROUTE } from '../../src/payments/bench-naive'
import { buildApp } from '../../src/server'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment } from '../support/http'
import { startGatedProvider, type GatedProvider } from '../support/server'
import { waitFor } from '../support/wait'

let db: TestDatabase
let provider: GatedProvider
beforeAll(async () => {
  db = await createTestDatabase('bench_naive')
  provider = await startGatedProvider()
})
afterAll(async () => {
  await provider?.stop()
  await db?.drop()
})

function app(env: Record<string, string>) {
  const config = loadConfig({ API_KEYS: 'acme:acme-key,globex:globex-key', PAYMENT_PROVIDER_URL: provider.url, ...env })
  return buildApp({ config, pools: db.pools, metrics: createMetrics() })
}

const post = (body: unknown, options: { key?: string | null; apiKey?: string } = {}) => {
  const headers: Record<string, string> = { authorization: `Bearer ${options.apiKey ?? 'acme-key'}`, 'content-type': 'application/json' }
  if (options.key !== null) headers['idempotency-key'] = options.key ?? crypto.randomUUID()
  return new Request(`http://bench.test${BENCH_NAIVE_ROUTE}`, { method: 'POST', headers, body: JSON.stringify(body) })
}

async function paymentsFor(key: string, tenant = 'acme'): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from payments where tenant = ${tenant} and idempotency_key = ${key}`
  return row!.n
}

test('absent in normal operation: 404, nothing written, no table made', async () => {
  for (const env of [{}, { BENCH_BASELINE_ROUTE: '0' }]) {
    const response = await app(env).handle(post(payment(), { key: 'absent' }))
    expect(response.status).toBe(404)
  }
  expect(await paymentsFor('absent')).toBe(0)
  const [row] = await db.sql<{ table: string | null }[]>`select to_regclass('bench_naive_keys')::text as table`
  expect(row!.table).toBeNull()
})

test('with BENCH_BASELINE_ROUTE=1: a payment, then its stored answer for the same key; the real route\'s checks', async () => {
  const bench = app({ BENCH_BASELINE_ROUTE: '1' })
  const key = `naive-${crypto.randomUUID()}`
  const customer = `cus_naive_${crypto.randomUUID().slice(0, 8)}`
  const first = await bench.handle(post(payment({ customer }), { key }))
  expect(first.status).toBe(201)
  const body = await first.json() as { id: string; provider_reference: string; customer: string }
  expect(first.headers.get('location')).toBe(`/api/payments/${body.id}`)
  expect(body.customer).toBe(customer)

  const again = await bench.handle(post(payment({ customer }), { key }))
  expect(again.status).toBe(201)
  expect(again.headers.get('idempotent-replayed')).toBe('true')
  expect(again.headers.get('location')).toBe(`/api/payments/${body.id}`)
  expect(await again.json()).toEqual(body)
  expect(await paymentsFor(key)).toBe(1)
  // The provider was called once, with the request's key (scoped and hashed) passed downstream.
  const charges = await provider.charges(customer)
  expect(charges.map((charge) => charge.id)).toEqual([body.provider_reference])
  const [keyed] = await db.sql<{ n: number }[]>`select count(*)::int as n from bench_naive_keys where tenant = 'acme' and key = ${key}`
  expect(keyed!.n).toBe(1)

  // Another tenant's equal key is another request: its own payment and charge.
  const other = await bench.handle(post(payment({ customer }), { key, apiKey: 'globex-key' }))
  expect(other.status).toBe(201)
  expect(other.headers.get('idempotent-replayed')).toBeNull()
  expect(((await other.json()) as { provider_reference: string }).provider_reference).not.toBe(body.provider_reference)
  expect(await paymentsFor(key, 'globex')).toBe(1)

  // The same refusals as the real route, before anything is written.
  const refusals: [Request, number, string][] = [
    [post(payment(), { key: null }), 400, 'missing-idempotency-key'],
    [post(payment(), { key: 'with space' }), 400, 'invalid-idempotency-key'],
    [post({ ...payment(), extra: 1 }, { key: 'bad-body' }), 400, 'invalid-body'],
    [post(payment(), { key: 'no-auth', apiKey: 'wrong' }), 401, 'unauthorized'],
  ]
  for (const [request, status, code] of refusals) {
    const response = await bench.handle(request)
    expect(response.status).toBe(status)
    expect(response.headers.get('content-type')).toContain('application/problem+json')
    expect(((await response.json()) as { type: string }).type).toEndWith(`:${code}`)
  }
  expect(await paymentsFor('bad-body') + await paymentsFor('no-auth')).toBe(0)
})

test('broken under a storm, as the naive design is: N concurrent requests with one key make N payments of one charge', async () => {
  const bench = app({ BENCH_BASELINE_ROUTE: '1' })
  const n = 8
  const key = `naive-storm-${crypto.randomUUID()}`
  const customer = `cus_storm_${crypto.randomUUID().slice(0, 8)}`
  // Every request is held in its provider call: all of them passed the check before any inserted.
  provider.hold(n)
  const answers = Array.from({ length: n }, () => bench.handle(post(payment({ customer }), { key })))
  try {
    await waitFor(() => provider.held() === n, () => `${n} requests held at the provider (${provider.held()} are)`)
  } finally {
    provider.release()
  }
  const statuses = await Promise.all(answers.map(async (answer) => (await answer).status))
  expect(statuses).toEqual(Array.from({ length: n }, () => 201))
  expect(await paymentsFor(key)).toBe(n)
  // The provider kept its side (one key downstream, one charge); the duplicates are ours.
  const charges = await provider.charges(customer)
  expect(charges).toHaveLength(1)
  const [ledgerKey] = await db.sql<{ n: number }[]>`select count(*)::int as n from bench_naive_keys where tenant = 'acme' and key = ${key}`
  expect(ledgerKey!.n).toBe(1)
})
