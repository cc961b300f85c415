/**
 * The bench's non-idempotent yardstick route exists only with
 * BENCH_BASELINE_ROUTE=1, and then inserts one payment per request (that is
 * its point: no key, no protection).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { loadConfig } from '../../src/config'
import { createMetrics } from '../../src/metrics/registry'
import { BENCH_BASELINE_ROUTE } from '../../src/payments/bench-baseline'
import { buildApp } from '../../src/server'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment } from '../support/http'
import { startProvider, type ProviderHandle } from '../support/server'

let db: TestDatabase
let provider: ProviderHandle
beforeAll(async () => {
  db = await createTestDatabase('bench_baseline')
  provider = await startProvider()
})
afterAll(async () => {
  await provider?.stop()
  await db?.drop()
})

function app(env: Record<string, string>) {
  const config = loadConfig({ API_KEYS: 'acme:acme-key', PAYMENT_PROVIDER_URL: provider.url, ...env })
  return buildApp({ config, pools: db.pools, metrics: createMetrics() })
}

const post = (body: unknown) => new Request(`http://bench.test${BENCH_BASELINE_ROUTE}`, {
  method: 'POST',
  headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json' },
  body: JSON.stringify(body),
})

async function baselinePayments(): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from payments where idempotency_key = 'bench-baseline'`
  return row?.n ?? 0
}

test('absent in normal operation: 404, nothing written', async () => {
  const normal = app({})
  expect((await normal.handle(post(payment()))).status).toBe(404)
  expect((await app({ BENCH_BASELINE_ROUTE: '0' }).handle(post(payment()))).status).toBe(404)
  expect(await baselinePayments()).toBe(0)
})

test('a bad BENCH_BASELINE_ROUTE value stops the start', () => {
  expect(() => loadConfig({ BENCH_BASELINE_ROUTE: 'yes' })).toThrow('BENCH_BASELINE_ROUTE')
})

test('with BENCH_BASELINE_ROUTE=1: one payment per request, same body checks as the real route', async () => {
  const bench = app({ BENCH_BASELINE_ROUTE: '1' })
  const first = await bench.handle(post(payment()))
  expect(first.status).toBe(201)
  const body = await first.json() as { id: string; amount: number; provider_reference: string }
  expect(first.headers.get('location')).toBe(`/api/payments/${body.id}`)
  expect(body.amount).toBe(1250)
  expect((await bench.handle(post(payment()))).status).toBe(201)
  expect(await baselinePayments()).toBe(2)
  const invalid = await bench.handle(post({ ...payment(), extra: 1 }))
  expect(invalid.status).toBe(400)
  expect(invalid.headers.get('content-type')).toContain('application/problem+json')
  const unauthorized = await bench.handle(new Request(`http://bench.test${BENCH_BASELINE_ROUTE}`, { method: 'POST', body: '{}' }))
  expect(unauthorized.status).toBe(401)
  expect(await baselinePayments()).toBe(2)
})
