/**
 * A key's fault is that key's alone (invariant 15): one key's row locked by
 * another session (an uncommitted insert of the key, an operator's SELECT ...
 * FOR UPDATE) fails no other key's request, of this tenant or another, however
 * the lane shares statements between them; and the stuck key's own completion
 * keeps trying while its deadline leaves time. Payments are counted in the
 * table and charges at the provider.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { claimBatchSql } from '../../src/core/claim-sql'
import { newLeaseId } from '../../src/core/lease-id'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, lockCompletionTarget, type TestDatabase } from '../support/db'
import { payment, paymentRequest } from '../support/http'
import { startGatedProvider, type GatedProvider } from '../support/server'
import { track, waitFor, waitForClaims } from '../support/wait'

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('key_lock') })
afterAll(async () => { await db?.drop() })

const TENANT_KEYS = { acme: 'acme-key', globex: 'globex-key' } as const
type Tenant = keyof typeof TENANT_KEYS

const paymentsOf = async (tenant: Tenant, key: string) =>
  (await db.sql<{ n: number }[]>`select count(*)::int as n from payments where tenant = ${tenant} and idempotency_key = ${key}`)[0]!.n

/** Another session's transaction on its own connection, ended (rolled back) whatever happens. */
async function foreignTransaction() {
  const session = await db.sql.reserve()
  await session`begin`
  let ended = false
  return {
    session,
    async end() {
      if (ended) return
      ended = true
      try {
        await session`rollback`
      } finally {
        session.release()
      }
    },
  }
}

describe('one key\'s locked row', () => {
  let service: InProcessService
  let provider: GatedProvider
  beforeAll(async () => {
    provider = await startGatedProvider()
    service = await startApp(db, { provider })
  })
  afterAll(async () => {
    await service?.stop()
    await provider?.stop()
  })

  const post = (tenant: Tenant, key: string, customer: string) =>
    service.handle(paymentRequest(service.url, payment({ customer }), { key, apiKey: TENANT_KEYS[tenant] }))

  // Catches: a statement of many members that waits on one member's lock for the session's lock_timeout and then
  // fails them all (every other key in it answered 503), or that fails them all at once without sending them again.
  test('held by another session\'s uncommitted insert of it: no other key\'s request, of either tenant, answers 5xx; one payment and one charge per key', async () => {
    const stuck = `stuck-${crypto.randomUUID()}`
    const foreign = await foreignTransaction()
    try {
      // The row another instance's stuck claim would leave: inserted, not committed.
      await foreign.session.unsafe(claimBatchSql, [JSON.stringify([{
        n: 0, tenant: 'acme', key: stuck, method: 'POST', path: '/api/payments', fingerprint: 'f'.repeat(64),
        lease: newLeaseId(), owner: null, now: null, ttl: 30, summary: null, http_request_id: null,
      }])])
      // Fresh payments of two tenants, each key twice at once, with the stuck key's requests among them.
      const keys = Array.from({ length: 60 }, (_, i) => ({ tenant: (i % 2 === 0 ? 'acme' : 'globex') as Tenant, key: `k-${i}-${crypto.randomUUID()}`, customer: `cus_lock_${i}` }))
      const others: Promise<Response>[] = []
      const stuckAnswers: Promise<Response>[] = []
      keys.forEach((k, i) => {
        others.push(post(k.tenant, k.key, k.customer), post(k.tenant, k.key, k.customer))
        if (i % 20 === 10) stuckAnswers.push(post('acme', stuck, 'cus_stuck'))
      })
      const tracked = stuckAnswers.map(track)
      // Every other key is answered while the row is still locked.
      const statuses = await Promise.all(others.map(async (answer) => (await answer).status))
      expect(await foreign.session`select 1`).toHaveLength(1) // the foreign transaction is still open
      expect(statuses.filter((status) => status >= 500)).toEqual([])
      expect(statuses.filter((status) => status === 201).length).toBeGreaterThanOrEqual(keys.length)
      await foreign.end()
      const stuckStatuses = await Promise.all(tracked.map(async ({ promise }) => (await promise).status))
      expect(stuckStatuses.every((status) => [201, 409, 503].includes(status))).toBe(true)
      for (const k of keys) {
        expect({ key: k.key, payments: await paymentsOf(k.tenant, k.key), charges: (await provider.charges(k.customer)).length })
          .toEqual({ key: k.key, payments: 1, charges: 1 })
      }
      expect(await paymentsOf('acme', stuck)).toBeLessThanOrEqual(1)
    } finally {
      await foreign.end()
    }
  })

  // Catches: a completion that gives up on its key's locked row (55P03) with a 503 while its deadline is far away,
  // leaving the customer charged with no payment; or one that waits on it beside other keys' completions.
  test('held FOR UPDATE while its request completes: the completions beside it commit meanwhile, and it completes once the lock clears (201, one payment, one charge)', async () => {
    const stuck = `stuck-${crypto.randomUUID()}`
    const beside = Array.from({ length: 6 }, (_, i) => ({ key: `beside-${i}-${crypto.randomUUID()}`, customer: `cus_beside_${i}` }))
    const retriesBefore = await lockedRetries()
    provider.hold(1 + beside.length)
    const foreign = await foreignTransaction()
    try {
      const stuckAnswer = track(post('acme', stuck, 'cus_stuck_completion'))
      const besideAnswers = beside.map((b) => post('globex', b.key, b.customer))
      await waitForClaims(db.sql, [stuck])
      await waitFor(() => provider.held() === 1 + beside.length, 'every charge to wait at the gate')
      await lockCompletionTarget(foreign.session, stuck, 'acme')
      provider.release()
      // The others complete while the stuck key's row is locked.
      expect(await Promise.all(besideAnswers.map(async (answer) => (await answer).status))).toEqual(beside.map(() => 201))
      // The stuck completion gave up on the lock at least once, and is trying again.
      await waitFor(async () => await lockedRetries() > retriesBefore, 'the stuck completion to be sent again after a lock failure')
      expect(stuckAnswer.settled()).toBe(false)
      await foreign.end()
      const answer = await stuckAnswer.promise
      expect(answer.status).toBe(201)
      expect({ payments: await paymentsOf('acme', stuck), charges: (await provider.charges('cus_stuck_completion')).length }).toEqual({ payments: 1, charges: 1 })
      for (const b of beside) expect(await paymentsOf('globex', b.key)).toBe(1)
    } finally {
      provider.release()
      await foreign.end()
    }
  })

  async function lockedRetries(): Promise<number> {
    const { values } = await service.metrics.statementRetries.get()
    return values.filter((value) => value.labels.statement === 'completion' && value.labels.cause === 'locked').reduce((sum, value) => sum + value.value, 0)
  }
})
