/**
 * Retries of a key this process is running are answered from memory
 * (http/running-keys.ts): 409 with Retry-After for the same request, 422 for
 * another, with no claim statement; once the run has ended the database
 * answers again (a replay, or a new run after a release). Never across
 * tenants, and never past the run's deadline. Keys another process runs:
 * after the database said 409, the same request's retries are answered 409
 * from memory for BUSY_MEMORY_MS (http/busy-keys.ts).
 */
import { afterAll, afterEach, beforeAll, expect, test } from 'bun:test'
import { claimStats } from '../../src/core/claim'
import { RunningKeys } from '../../src/http/running-keys'
import { BUSY_MEMORY_MS, BusyKeys } from '../../src/http/busy-keys'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, paymentRequest } from '../support/http'
import { startGatedProvider, type GatedProvider } from '../support/server'
import { waitFor } from '../support/wait'

let db: TestDatabase
let provider: GatedProvider
let service: InProcessService
beforeAll(async () => {
  db = await createTestDatabase('running_keys')
  provider = await startGatedProvider()
  service = await startApp(db, { provider })
})
// A failed test must not leave its charge held for the next one.
afterEach(() => provider.release())
afterAll(async () => {
  provider?.release()
  await service?.stop()
  await provider?.stop()
  await db?.drop()
})

const post = (body: unknown, key: string, apiKey?: string) =>
  service.handle(paymentRequest(service.url, body, { key, ...(apiKey ? { apiKey } : {}) }))

// Catches: retries of a running key that still send a claim statement each, or a 409/422 that differs from the database's.
test('retries of the key this process runs: 409 with Retry-After and 422 for another body, with no claim statement; then the replay', async () => {
  const key = `running-${crypto.randomUUID()}`
  const body = payment()
  provider.hold(1)
  const first = post(body, key)
  await waitFor(() => provider.held() === 1, 'the first request at the provider')
  const before = claimStats(db.pools.short).members
  const retries = await Promise.all(Array.from({ length: 20 }, () => post(body, key)))
  const edited = await post(payment({ amount: body.amount + 1 }), key)
  const claimsSent = claimStats(db.pools.short).members - before
  expect(retries.map((r) => r.status)).toEqual(Array(20).fill(409))
  expect(retries.every((r) => Number(r.headers.get('retry-after')) >= 1)).toBe(true)
  expect(retries[0]!.headers.get('content-type')).toContain('application/problem+json')
  expect(edited.status).toBe(422)
  expect(claimsSent).toBe(0)
  provider.release()
  const created = await first
  expect(created.status).toBe(201)
  const again = await post(body, key)
  expect({ status: again.status, replayed: again.headers.get('idempotent-replayed') }).toEqual({ status: 201, replayed: 'true' })
})

// Catches: an entry keyed by the key string alone (another tenant's request blocked with a 409 of ours).
test('another tenant\'s same key is not ours to answer: it runs', async () => {
  const key = `running-shared-${crypto.randomUUID()}`
  provider.hold(1)
  const acme = post(payment(), key)
  await waitFor(() => provider.held() === 1, 'the first request at the provider')
  const globex = await post(payment(), key, 'globex-key')
  expect(globex.status).toBe(201)
  provider.release()
  expect((await acme).status).toBe(201)
})

// Catches: an entry left behind by a failed run (a retry would get 409 until the process restarts).
test('a run that failed is forgotten: the retry runs again under the database\'s answer', async () => {
  const key = `running-failed-${crypto.randomUUID()}`
  provider.fail(1)
  expect((await post(payment(), key)).status).toBe(502)
  expect((await post(payment(), key)).status).toBe(201)
})

// Catches: an entry used past its run's deadline, when the database may already let a retry reclaim the key.
test('an entry is not used past the run\'s deadline, and leaving removes only its own run', async () => {
  const keys = new RunningKeys()
  const leave = keys.enter('t', 'k', 'f', 0, performance.now())
  expect(keys.get('t', 'k')).toBeUndefined()
  leave()
  // Counted from the claim's sending, not from entering: a claim answered 60 s late leaves nothing to use.
  const late = keys.enter('t', 'late', 'f', 60_000, performance.now() - 60_000)
  expect(keys.get('t', 'late')).toBeUndefined()
  late()
  const first = keys.enter('t', 'k2', 'f1', 60_000, performance.now())
  const second = keys.enter('t', 'k2', 'f2', 60_000, performance.now()) // a reclaim by this process while the old run ends
  first()
  expect(keys.get('t', 'k2')?.fingerprint).toBe('f2')
  second()
  expect(keys.size).toBe(0)
})

// Catches: a storm of retries of a key another process runs that sends a claim statement per retry, a 422
// answered from a 409 remembered for another request, or a 409 remembered after the key is done.
test('retries of a key another process runs: one claim statement says 409, the next ones are answered from memory; then the replay', async () => {
  const other = await startApp(db, { provider })
  try {
    const key = `busy-${crypto.randomUUID()}`
    const body = payment()
    provider.hold(1)
    const first = other.handle(paymentRequest(other.url, body, { key }))
    await waitFor(() => provider.held() === 1, 'the first request at the other process\'s provider call')
    const before = claimStats(db.pools.short).members
    expect((await post(body, key)).status).toBe(409)
    expect(claimStats(db.pools.short).members - before).toBe(1)
    const retries = await Promise.all(Array.from({ length: 20 }, () => post(body, key)))
    expect(retries.map((r) => r.status)).toEqual(Array(20).fill(409))
    expect(retries.every((r) => Number(r.headers.get('retry-after')) >= 1)).toBe(true)
    const memory = claimStats(db.pools.short).members - before
    expect((await post(payment({ amount: body.amount + 1 }), key)).status).toBe(422)
    expect({ memory, database: claimStats(db.pools.short).members - before }).toEqual({ memory: 1, database: 2 })
    provider.release()
    expect((await first).status).toBe(201)
    await waitFor(async () => (await post(body, key)).headers.get('idempotent-replayed') === 'true', 'the replay, once the memory of the 409 is over', 5_000)
  } finally {
    provider.release()
    await other.stop()
  }
})

// Catches: a remembered 409 used past BUSY_MEMORY_MS, for another request, or another tenant.
test('a remembered 409 lasts BUSY_MEMORY_MS, for the same request of the same tenant only', () => {
  let now = 1_000
  const busy = new BusyKeys(() => now)
  busy.note('t', 'k', 'f', 3)
  expect([busy.retryAfter('t', 'k', 'f'), busy.retryAfter('t', 'k', 'other'), busy.retryAfter('u', 'k', 'f')]).toEqual([3, undefined, undefined])
  now += BUSY_MEMORY_MS - 1
  expect(busy.retryAfter('t', 'k', 'f')).toBe(3)
  now += 1
  expect(busy.retryAfter('t', 'k', 'f')).toBeUndefined()
})
