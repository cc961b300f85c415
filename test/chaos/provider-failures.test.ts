/**
 * The payment provider fails 30% of calls, under load. A failed request is
 * answered 502 problem+json, its transaction rolls back (no payment) and its
 * key is released at once, so the retry runs afresh; in the end each key has
 * exactly one payment.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer, type ServerProcess } from '../support/server'
import { payment } from '../support/http'
import { chargedOnce, exactlyOnce, payUntilAnswered, paymentsByKey, tally, type Attempt } from './clients'

let db: TestDatabase
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('chaos_provider')
  server = await startServer(db.url, { PAYMENT_PROVIDER_FAILURE_RATE: '0.3', PAYMENT_PROVIDER_DELAY_MS: '20' })
})
afterAll(async () => {
  if (server?.proc.exitCode === null) await server.stop('SIGKILL')
  await db?.drop()
})

test('each 502 releases its key at once; retries succeed; one payment and one charge per key', async () => {
  const results = new Map<string, Attempt[]>()
  const customers = new Map<string, string>()
  let checkedReleases = 0
  await Promise.all(Array.from({ length: 40 }, async (_, i) => {
    const key = `provider-${i}-${crypto.randomUUID()}`
    customers.set(key, `cus_one_${i}`)
    const attempts: Attempt[] = []
    for (;;) {
      const attempt = await oneAttempt(key, customers.get(key)!)
      attempts.push(attempt)
      if (attempt.status === 201) break
      expect(attempt.status).toBe(502)
      // Released before the answer left: no payment, and the key free for the retry.
      const [row] = await db.sql<{ status: string }[]>`select status from idempotency_key_states where tenant = 'acme' and key = ${key}`
      const { p } = (await db.sql<{ p: number }[]>`select count(*)::int as p from payments where idempotency_key = ${key}`)[0]!
      expect([row?.status, p]).toEqual(['released', 0])
      checkedReleases++
    }
    results.set(key, attempts)
  }))
  const counts = tally(results.values())
  console.log(`provider failures, one client per key: ${JSON.stringify(counts)}; ${checkedReleases} 502s checked released`)
  expect(checkedReleases).toBeGreaterThan(0)
  for (const attempts of results.values())
    for (const a of attempts.filter((a) => a.status === 502)) expect(a.contentType).toBe('application/problem+json')
  expect(exactlyOnce(results, await paymentsByKey(db.sql))).toEqual([])
  expect(await chargedOnce(db.sql, server.provider, customers)).toEqual([])
}, 60_000)

test('3 concurrent retrying clients per key under 30% provider failures: exactly one payment and one charge per key', async () => {
  await db.sql`truncate payments, idempotency_keys`
  const results = new Map<string, Attempt[]>()
  const customers = new Map<string, string>()
  await Promise.all(Array.from({ length: 30 }, async (_, i) => {
    const key = `provider-dup-${i}-${crypto.randomUUID()}`
    customers.set(key, `cus_dup_${i}`)
    const all = await Promise.all([0, 1, 2].map(() => payUntilAnswered(key, payment({ customer: customers.get(key)! }), { url: () => server.url, pauseMs: 50 })))
    results.set(key, all.flat())
  }))
  const counts = tally(results.values())
  console.log(`provider failures, 3 clients per key: ${JSON.stringify(counts)}`)
  expect(counts['502'] ?? 0).toBeGreaterThan(0)
  expect(Object.keys(counts).filter((label) => !['201', '201 replay', '409', '502'].includes(label))).toEqual([])
  expect(exactlyOnce(results, await paymentsByKey(db.sql))).toEqual([])
  expect(await chargedOnce(db.sql, server.provider, customers)).toEqual([])
  const { processing } = (await db.sql<{ processing: number }[]>`select count(*)::int as processing from idempotency_key_states where status = 'processing'`)[0]!
  expect(processing).toBe(0)
}, 60_000)

async function oneAttempt(key: string, customer: string): Promise<Attempt> {
  const started = performance.now()
  const response = await fetch(`${server.url}/api/payments`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer acme-key', 'idempotency-key': key },
    body: JSON.stringify(payment({ customer })),
  })
  const text = await response.text()
  return {
    status: response.status,
    replayed: response.headers.get('idempotent-replayed') === 'true',
    contentType: response.headers.get('content-type'),
    ms: performance.now() - started,
    ...(response.status === 201 ? { paymentId: (JSON.parse(text) as { id: string }).id } : {}),
  }
}
