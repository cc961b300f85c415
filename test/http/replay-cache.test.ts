/**
 * Replays of completed keys from this process's memory (http/replay-cache.ts):
 * the same answer byte for byte as from the database, 422 for another
 * request, nothing across tenants, and nothing past the key's retention.
 * The proof that no database is asked: the answer stays the first one even
 * after the stored row is changed by hand (no code path of ours changes a
 * done row: that is what makes the cache safe).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { MAX_SENT_TEXT_CHARS, ReplayCache, replayMarginMs } from '../../src/http/replay-cache'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, lockCompletionTarget, type TestDatabase } from '../support/db'
import { payment, paymentRequest } from '../support/http'
import { startGatedProvider } from '../support/server'
import { waitFor } from '../support/wait'

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

// Catches: a byte-for-byte shortcut that ignores the path or the text (it would replay one request's answer to
// another without the fingerprint's check), or that keeps a body of any size in memory.
test('the unparsed shortcut takes only the very text and path the cache saw; other spellings go through the fingerprint', () => {
  const cache = new ReplayCache(10)
  const answer = { status: 201, headers: {}, body: '{}' }
  const sent = { path: '/api/payments', text: '{"amount":1,"currency":"EUR","customer":"c"}' }
  cache.set('t', 'k', { fingerprint: 'f', sent }, answer, 3600, performance.now())
  expect(cache.sameAs('t', 'k', { ...sent })?.response).toBe(answer)
  expect(cache.sameAs('t', 'k', { ...sent, text: '{"currency":"EUR","amount":1,"customer":"c"}' })).toBeUndefined()
  expect(cache.sameAs('t', 'k', { ...sent, text: sent.text.replace('1', '2') })).toBeUndefined()
  expect(cache.sameAs('t', 'k', { ...sent, path: '/api/orders' })).toBeUndefined()
  expect(cache.sameAs('u', 'k', sent)).toBeUndefined()
  expect(cache.get('t', 'k')?.fingerprint).toBe('f')
  const large = { path: sent.path, text: `{"description":"${'x'.repeat(MAX_SENT_TEXT_CHARS)}"}` }
  cache.set('t', 'large', { fingerprint: 'g', sent: large }, answer, 3600, performance.now())
  expect(cache.sameAs('t', 'large', large)).toBeUndefined()
  expect(cache.get('t', 'large')?.sent).toBeUndefined()
})

// Catches: entries that outlive the key's retention, or are kept past the bound.
test('an entry is dropped a margin before its key\'s retention ends, and the cache keeps at most its bound', async () => {
  const cache = new ReplayCache(2)
  const answer = { status: 201, headers: {}, body: '{}' }
  cache.set('t', 'young', { fingerprint: 'f' }, answer, 3600, performance.now(), 0)
  cache.set('t', 'near-end', { fingerprint: 'f' }, answer, 3600, performance.now(), 3600 - replayMarginMs(3600) / 1000 + 1)
  expect(cache.get('t', 'young')).toBeDefined()
  expect(cache.get('t', 'near-end')).toBeUndefined()
  cache.set('t', 'a', { fingerprint: 'f' }, answer, 3600, performance.now())
  cache.set('t', 'b', { fingerprint: 'f' }, answer, 3600, performance.now())
  expect(cache.size).toBe(2)
  expect(cache.get('t', 'young')).toBeUndefined() // the least recently used went first
  expect(new ReplayCache(0).get('t', 'x')).toBeUndefined()
})

// Catches: a cache that evicts by age of insertion only (a key replayed all the time goes as soon as enough
// new keys come), or one that never evicts.
test('a key in use stays while new keys come and go; the ones nobody asks for go first', () => {
  const cache = new ReplayCache(4)
  const answer = { status: 201, headers: {}, body: '{}' }
  const put = (key: string) => cache.set('t', key, { fingerprint: 'f' }, answer, 3600, performance.now())
  for (const key of ['hot', 'a', 'b', 'c']) put(key)
  for (let n = 0; n < 40; n++) {
    expect(cache.get('t', 'hot')).toBeDefined()
    put(`new-${n}`)
    expect(cache.size).toBe(4)
  }
  expect(cache.get('t', 'a')).toBeUndefined()
  expect(cache.get('t', 'new-0')).toBeUndefined()
  expect(cache.get('t', 'new-39')).toBeDefined()
})

// Catches: an expiry that is never checked once the entry is in (the check in get() deleted), or one counted
// from when the answer arrived instead of from before its statement was sent.
test('an entry stops being used when its time is up, counted from before its statement was sent', () => {
  let now = 1_000_000
  const cache = new ReplayCache(10, () => now)
  const answer = { status: 201, headers: {}, body: '{}' }
  const usableMs = 2_000 - replayMarginMs(2)
  cache.set('t', 'k', { fingerprint: 'f' }, answer, 2, now)
  now += usableMs - 1
  expect(cache.get('t', 'k')).toBeDefined()
  now += 1
  expect(cache.get('t', 'k')).toBeUndefined()
  // The completion was sent at `sent`; its answer came back 900 ms later (a lock wait, a synchronous standby).
  const sent = now
  now += 900
  cache.set('t', 'slow', { fingerprint: 'f' }, answer, 2, sent)
  now = sent + usableMs
  expect(cache.get('t', 'slow')).toBeUndefined()
  // A replay read from the database: the key was 1.5 s old when the statement (sent at `sent`) ran.
  cache.set('t', 'old', { fingerprint: 'f' }, answer, 2, sent, 1.5)
  expect(cache.get('t', 'old')).toBeUndefined()
})

// Catches: an entry counted from when the completion's answer arrived. The completion's UPDATE sets
// completed_at, then waits 700 ms on a row lock before it commits; at a retention of 2 s the answer then
// stayed in A's memory ~0.5 s past the key's retention, while B had already bound the key to a new request:
// A answered that request 422 (SPEC: a key past its retention is a new key, on every instance alike).
test('a commit answered late does not keep the answer past the key\'s retention on this instance', async () => {
  const env = { IDEMPOTENCY_TTL_SECONDS: '2', IDEMPOTENCY_RETENTION_SECONDS: '2' }
  const provider = await startGatedProvider()
  const a = await startApp(db, { env, provider })
  const b = await startApp(db, { env })
  try {
    const key = `late-commit-${crypto.randomUUID()}`
    provider.hold(1)
    const first = a.handle(paymentRequest(a.url, payment(), { key }))
    await waitFor(() => provider.held() === 1, 'A\'s charge at the gate (its key claimed, its provider call running)')
    // Locked while A's provider call is held: A's completing UPDATE then waits for it with completed_at already set.
    let locked = () => undefined as void
    const lockTaken = new Promise<void>((resolve) => { locked = resolve })
    const held = db.sql.begin(async (tx) => {
      await lockCompletionTarget(tx, key)
      locked()
      // The late commit: the lock is let go once A's UPDATE has waited on it for 700 ms (a lock wait, a synchronous standby).
      await waitFor(async () => (await tx<{ pid: number }[]>`
        select pid from pg_stat_activity
        where datname = current_database() and wait_event_type = 'Lock' and pid <> pg_backend_pid()
          and clock_timestamp() - query_start >= interval '700 ms'`).length > 0, 'A\'s completion to wait 700 ms on the row lock')
    })
    await lockTaken
    provider.release()
    expect((await first).status).toBe(201)
    await held
    await waitFor(async () => {
      const [row] = await db.sql<{ past: boolean }[]>`
        select clock_timestamp() > completed_at + interval '2.05 seconds' as past from idempotency_key_states where key = ${key}`
      return row?.past === true
    }, 'the key past its retention', 5_000)
    const rebound = await b.handle(paymentRequest(b.url, payment({ amount: 777 }), { key }))
    expect({ status: rebound.status, replayed: rebound.headers.get('idempotent-replayed') }).toEqual({ status: 201, replayed: null })
    const onA = await a.handle(paymentRequest(a.url, payment({ amount: 777 }), { key }))
    expect({ status: onA.status, replayed: onA.headers.get('idempotent-replayed'), body: await onA.text() })
      .toEqual({ status: 201, replayed: 'true', body: await rebound.text() })
  } finally {
    await a.stop()
    await b.stop()
    await provider.stop()
  }
})
