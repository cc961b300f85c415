/**
 * A recording step whose connection is lost while it waits (it should not
 * wait on anything slow, but user code may) must not be able to write
 * anything afterwards. postgres.js sends such a
 * late query to the same connection object, which by then is either closed
 * (the write crashed the process from a timer) or reconnected for another
 * request (the INSERT would run in someone else's session). See
 * src/core/transaction-guard.ts.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { isUnavailable } from '../../src/core/errors'
import { openPools, type Pools } from '../../src/store/db'
import { createTestDatabase, type TestDatabase } from '../support/db'

let db: TestDatabase
let pools: Pools
beforeAll(async () => {
  db = await createTestDatabase('stale_tx')
  // One work connection: after the kill, the next work query gets the very same connection object.
  pools = openPools(db.url, { applicationName: 'stale-tx', workMax: 1, shortMax: 2 })
})
afterAll(async () => {
  await pools?.close(1)
  await db?.drop()
})

test('a handler that outlives its lost connection writes nothing, anywhere', async () => {
  const identity = { tenant: 'acme', key: `stale-${crypto.randomUUID()}`, method: 'POST', path: '/api/payments', fingerprint: 'a'.repeat(64) }
  const claimed = await claim(pools.short, identity, { ttlSeconds: 30, retentionSeconds: 86_400 })
  if (claimed.kind !== 'created') throw new Error(`unexpected claim: ${claimed.kind}`)

  let started!: () => void
  const handlerStarted = new Promise<void>((resolve) => { started = resolve })
  let proceed!: () => void
  const providerAnswers = new Promise<void>((resolve) => { proceed = resolve })
  let lateWrite: unknown = 'not attempted'
  let attempted!: () => void
  const lateWriteAttempted = new Promise<void>((resolve) => { attempted = resolve })

  const run = complete(pools.work, claimed.lease, async (tx) => {
    started()
    await providerAnswers // something slow: no query is pending on the connection meanwhile
    try {
      await tx`insert into payments (tenant, amount, currency, customer, status, provider_ref, idempotency_key)
               values ('acme', 100, 'EUR', 'late', 'succeeded', 'ch_late', ${identity.key})`
      lateWrite = 'executed'
    } catch (error) {
      lateWrite = error
      throw error
    } finally {
      attempted()
    }
    return { status: 201, headers: {}, body: '{}' }
  }).then(() => 'resolved', (error: unknown) => error)

  await handlerStarted
  // The database drops the worker's connection (a restart, an operator's pg_terminate_backend).
  const { terminated } = (await db.sql<{ terminated: number }[]>`
    select count(pg_terminate_backend(pid))::int as terminated from pg_stat_activity
     where datname = current_database() and application_name = 'stale-tx:work'`)[0]!
  expect(terminated).toBe(1)

  // Another request now uses the work pool: the same connection object,
  // reconnected (it can only run once the client has seen the close).
  let bystanderRows = -1
  let inTransaction!: () => void
  const bystanderInTransaction = new Promise<void>((resolve) => { inTransaction = resolve })
  const bystander = pools.work.begin(async (other) => {
    await other`select 1`
    inTransaction()
    await lateWriteAttempted // its transaction is open while the stale handler wakes up and tries its write
    const n = (await other<{ n: number }[]>`select count(*)::int as n from payments where customer = 'late'`)[0]!.n
    bystanderRows = n
  })
  await bystanderInTransaction
  proceed()

  const outcome = await run
  await bystander
  expect(outcome).not.toBe('resolved')
  expect(isUnavailable(outcome)).toBe(true)
  expect(isUnavailable(lateWrite)).toBe(true)
  expect(bystanderRows).toBe(0) // the late INSERT did not land in the bystander's transaction
  const { payments } = (await db.sql<{ payments: number }[]>`select count(*)::int as payments from payments`)[0]!
  expect(payments).toBe(0)
  // The key was not completed (the plugin then releases it; see test/http).
  const [key] = await db.sql<{ status: string }[]>`select status from idempotency_key_states where key = ${identity.key}`
  expect(key!.status).toBe('processing')
  // And the pool still works.
  expect((await pools.work`select 1 as one`)[0]?.one).toBe(1)
}, 20_000)
