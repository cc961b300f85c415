/**
 * The deadline margin (src/core/policy.ts executionBudgetMs): a request is
 * stopped a margin before its key's TTL ends, so that its answer and the
 * release of its key land before anyone may reclaim the key. A deadline
 * equal to the TTL would let a retry reclaim the key while its worker still
 * runs, and the worker then race the new owner.
 *
 * A handler that never finishes on its own runs into its deadline; the
 * database's own clock then says when the key was claimed (locked_at) and
 * when it was given back (released_at): before locked_at + TTL, the instant
 * the key turns stale. Both times are the database's, so no clock is compared
 * with another.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { Elysia } from 'elysia'
import { deadlineMarginMs } from '../../src/core/policy'
import { idempotentPost, type Validation } from '../../src/http/idempotency'
import { createTestDatabase, type TestDatabase } from '../support/db'

/** 4 s: a margin of 400 ms, ample for the claim's and the release's round trips on a loaded machine. */
const TTL_SECONDS = 4

let db: TestDatabase
let app: Elysia
let stoppedAt: number | undefined

beforeAll(async () => {
  db = await createTestDatabase('deadline_margin')
  app = new Elysia().use(idempotentPost({ pools: db.pools, tenant: () => 'acme', ttlSeconds: TTL_SECONDS }, {
    path: '/slow',
    validate: (body): Validation<unknown> => ({ ok: true, value: body }),
    // Waits for its deadline, as a handler stuck on a foreign call does.
    act: ({ signal }) => new Promise<never>((_, reject) => {
      signal.addEventListener('abort', () => { stoppedAt = performance.now(); reject(signal.reason) }, { once: true })
    }),
    record: async () => ({ status: 201, body: {} }),
  })) as unknown as Elysia
})
afterAll(() => db?.drop())

test('a request that runs into its deadline has answered and released its key before the key can be reclaimed', async () => {
  const key = `margin-${crypto.randomUUID()}`
  const started = performance.now()
  const response = await app.handle(new Request('http://service.test/slow', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: '{}',
  }))
  expect(response.status).toBe(504)
  expect(((await response.json()) as { code: string }).code).toBe('deadline-exceeded')
  expect(stoppedAt).toBeDefined()

  const [row] = await db.sql<{ status: string; claimed_to_released_ms: number; ttl_ms: number }[]>`
    select status, (extract(epoch from (released_at - locked_at)) * 1000)::float8 as claimed_to_released_ms, ${TTL_SECONDS * 1000}::float8 as ttl_ms
      from idempotency_key_states where tenant = 'acme' and key = ${key}`
  expect(row!.status).toBe('released')
  // The invariant: given back before it turned stale (locked_at + TTL).
  expect(row!.claimed_to_released_ms).toBeLessThan(row!.ttl_ms)
  // And stopped by the deadline, not earlier: the handler had its budget.
  expect(stoppedAt! - started).toBeGreaterThanOrEqual(TTL_SECONDS * 1000 - deadlineMarginMs(TTL_SECONDS) - 50)
}, 20_000)
