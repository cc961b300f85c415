/**
 * Replays of completed keys from this process's memory (http/replay-cache.ts):
 * the same answer byte for byte as from the database, 422 for another
 * request, nothing across tenants, and nothing past the key's retention.
 * The proof that no database is asked: the answer stays the first one even
 * after the stored row is changed by hand (no code path of ours changes a
 * done row: that is what makes the cache safe).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { ReplayCache, replayMarginMs } from '../../src/http/replay-cache'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, paymentRequest } from '../support/http'

let db: TestDatabase
let service: InProcessService
beforeAll(async () => {
  db = await createTestDatabase('replay_cache')
  service = await startApp(db)
})
afterAll(async () => {
  await service?.stop()
  await db?.drop()
})

const post = (body: unknown, key: string, apiKey?: string) =>
  service.handle(paymentRequest(service.url, body, { key, ...(apiKey ? { apiKey } : {}) }))

// Catches: a cache that is never used (every replay reads the row), or one that answers another request's.
test('a finished key is replayed from memory: the first answer byte for byte, 422 for another body', async () => {
  const key = `cached-${crypto.randomUUID()}`
  const first = await post(payment(), key)
  expect(first.status).toBe(201)
  const firstBody = await first.text()
  await db.sql`update idempotency_keys set response_body = '{"changed":true}' where key = ${key}`
  const again = await post(payment(), key)
  expect({ status: again.status, replayed: again.headers.get('idempotent-replayed'), body: await again.text() })
    .toEqual({ status: 201, replayed: 'true', body: firstBody })
  expect((await post(payment({ amount: 9999 }), key)).status).toBe(422)
})

// Catches: a cache keyed by the key string alone (one tenant's answer replayed to another).
test('another tenant\'s same key is another request', async () => {
  const key = `shared-${crypto.randomUUID()}`
  const acme = await (await post(payment(), key)).json() as { id: string }
  const globex = await post(payment(), key, 'globex-key')
  expect(globex.status).toBe(201)
  expect(globex.headers.get('idempotent-replayed')).toBeNull()
  expect(((await globex.json()) as { id: string }).id).not.toBe(acme.id)
})

// Catches: entries that outlive the key's retention, or are kept past the bound.
test('an entry is dropped a margin before its key\'s retention ends, and the cache keeps at most its bound', async () => {
  const cache = new ReplayCache(2)
  const answer = { status: 201, headers: {}, body: '{}' }
  cache.set('t', 'young', 'f', answer, 3600, 0)
  cache.set('t', 'near-end', 'f', answer, 3600, 3600 - replayMarginMs(3600) / 1000 + 1)
  expect(cache.get('t', 'young')).toBeDefined()
  expect(cache.get('t', 'near-end')).toBeUndefined()
  cache.set('t', 'a', 'f', answer, 3600)
  cache.set('t', 'b', 'f', answer, 3600)
  expect(cache.size).toBe(2)
  expect(cache.get('t', 'young')).toBeUndefined() // the least recently used went first
  expect(new ReplayCache(0).get('t', 'x')).toBeUndefined()
})
