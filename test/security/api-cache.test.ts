/** Every /api answer says `Cache-Control: no-store` (issue 27): a payment, a replay, a refusal; nothing else is changed. */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'

let db: TestDatabase
let app: InProcessService
beforeAll(async () => {
  db = await createTestDatabase('api_cache')
  app = await startApp(db)
})
afterAll(async () => {
  await app?.stop()
  await db?.drop()
})

test('payments, their replays, reads and refusals are never stored by a cache', async () => {
  const headers = { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': 'cache-1' }
  const body = JSON.stringify({ amount: 100, currency: 'EUR', customer: 'cus_cache' })
  const created = await app.fetch('/api/payments', { method: 'POST', headers, body })
  const replayed = await app.fetch('/api/payments', { method: 'POST', headers, body })
  const { id } = (await created.json()) as { id: string }
  const read = await app.fetch(`/api/payments/${id}`, { headers })
  const list = await app.fetch('/api/payments?customer=cus_cache', { headers })
  const refused = await app.fetch('/api/payments', { method: 'POST', headers: { ...headers, authorization: 'Bearer nope' }, body })
  for (const [name, answer] of Object.entries({ created, replayed, read, list, refused })) expect({ name, cache: answer.headers.get('cache-control') }).toEqual({ name, cache: 'no-store' })
  expect(replayed.headers.get('idempotent-replayed')).toBe('true')
  expect((await app.fetch('/healthz')).headers.get('cache-control')).toBeNull()
})
