/**
 * A provider that hangs (it answers after a minute) and a TTL of 2 s. The
 * worker stops at its deadline, a little before the TTL: the client gets 504
 * problem+json with Retry-After, the key is released at once (not left
 * processing until a reclaim), and a retry runs again under the same
 * downstream key, so the provider holds one charge request, not two.
 *
 * Catches: a deadline that is not enforced (the answer would wait for the
 * provider, a minute, and the key would stay in processing meanwhile).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer, type ServerProcess } from '../support/server'
import { payment, postPayment } from '../support/http'
import { waitFor } from '../support/wait'

const TTL_SECONDS = 2
/** The grace Bounded processing allows past the TTL (docs/explanation/invariants.md); generous, since the machine may be busy. */
const GRACE_MS = 5_000

let db: TestDatabase
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('chaos_hang')
  server = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: String(TTL_SECONDS), PAYMENT_PROVIDER_DELAY_MS: '60000' })
})
afterAll(async () => {
  if (server?.proc.exitCode === null) await server.stop('SIGKILL')
  await db?.drop()
})

async function keyRow(key: string) {
  const [row] = await db.sql<{ status: string; attempts: number; request_id: string }[]>`
    select status, attempts, request_id from idempotency_key_states where tenant = 'acme' and key = ${key}`
  return row
}

test('a hung provider: 504 within the TTL plus grace, the key released at once, a retry runs again under the same request', async () => {
  const key = `hang-${crypto.randomUUID()}`
  const body = payment({ customer: `cus_hang_${crypto.randomUUID().slice(0, 8)}` })
  // Bounded from outside: if the deadline were not enforced this would abort and fail the test.
  const first = await postPayment(server.url, body, { key, signal: AbortSignal.timeout(TTL_SECONDS * 1000 + GRACE_MS) })
  expect(first.status).toBe(504)
  expect(first.headers.get('content-type')).toBe('application/problem+json')
  expect(Number(first.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
  expect(await first.json()).toMatchObject({ code: 'deadline-exceeded', status: 504 })
  const released = await keyRow(key)
  expect(released?.status).toBe('released')

  // A 409 never waits: a retry is answered at once, and runs (the key is free), into the same deadline.
  const retry = await postPayment(server.url, body, { key, signal: AbortSignal.timeout(TTL_SECONDS * 1000 + GRACE_MS) })
  expect(retry.status).toBe(504)
  const after = await keyRow(key)
  expect(after).toMatchObject({ status: 'released', attempts: 2, request_id: released!.request_id })
  // Both executions asked the provider under one downstream key: at most one charge can come of them.
  expect(server.provider.pending()).toBe(2)
  const [paid] = await db.sql`select count(*)::int as n from payments where idempotency_key = ${key}`
  expect(paid!.n).toBe(0)
}, 30_000)

test('while a request waits on the provider, its retries get 409 at once and no connection of the service is in a transaction', async () => {
  const key = `hang-409-${crypto.randomUUID()}`
  const body = payment({ customer: `cus_hang_${crypto.randomUUID().slice(0, 8)}` })
  const pendingBefore = server.provider.pending()
  const first = postPayment(server.url, body, { key })
  await waitFor(() => server.provider.pending() > pendingBefore, 'the first request to reach the provider')
  // Catches a claim that waits: a waiting retry would come back after the first's 504, not as a 409.
  const retries = await Promise.all(Array.from({ length: 20 }, () => postPayment(server.url, body, { key })))
  expect(retries.map((r) => r.status)).toEqual(Array(20).fill(409))
  // The external phase holds no connection: no backend of the service sits in a transaction.
  const busy = await db.sql`
    select state from pg_stat_activity
     where datname = current_database() and application_name like 'idempotent-post:%' and state like 'idle in transaction%'`
  expect(busy).toHaveLength(0)
  expect((await first).status).toBe(504)
}, 30_000)
