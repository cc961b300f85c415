/**
 * Exactly once at the provider (docs/explanation/invariants.md), counted where the money moves: the provider's ledger. Lost
 * provider answers, a SIGKILL mid-charge and re-executions after a release
 * must all end in exactly one charge per (tenant, key, request), and the
 * payment's provider_reference must be that charge.
 *
 * Catches: a downstream key that changes per attempt (derived from the lease,
 * the attempt, or a random id): every re-execution would charge again.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startProvider, startServer, type ProviderHandle, type ServerProcess } from '../support/server'
import { waitFor } from '../support/wait'
import { chargedOnce, exactlyOnce, payUntilAnswered, paymentsByKey, tally, type Attempt } from './clients'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('chaos_charges')
})
afterAll(() => db?.drop())

const newCustomer = (label: string) => `cus_${label}_${crypto.randomUUID().slice(0, 8)}`

async function paymentRef(key: string, tenant = 'acme'): Promise<string | undefined> {
  const [row] = await db.sql<{ provider_ref: string }[]>`select provider_ref from payments where tenant = ${tenant} and idempotency_key = ${key}`
  return row?.provider_ref
}

test('every answer of the first execution lost: 502, the key released; the retry gets the charge already made, not a second one', async () => {
  // The simulator draws once per charge for "fail?" (rate 0: never) and once for "lose the answer?".
  let lose = true
  const provider = await startProvider({ lostResponseRate: 0.5, random: () => (lose ? 0 : 0.99) })
  const server = await startServer(db.url, {}, { provider })
  try {
    const key = `lost-${crypto.randomUUID()}`
    const customer = newCustomer('lost')
    const first = await postPayment(server.url, payment({ customer }), { key })
    expect(first.status).toBe(502) // the client asked again with the same key, and lost every answer
    expect((await provider.charges(customer)).length).toBe(1) // made once, however often it was asked
    const [row] = await db.sql`select status from idempotency_key_states where key = ${key}`
    expect(row!.status).toBe('released')

    lose = false
    const retry = await postPayment(server.url, payment({ customer }), { key })
    expect(retry.status).toBe(201)
    const charges = await provider.charges(customer)
    expect(charges).toHaveLength(1)
    expect(((await retry.json()) as { provider_reference: string }).provider_reference).toBe(charges[0]!.id)
    expect(await paymentRef(key)).toBe(charges[0]!.id)
  } finally {
    await server.stop()
    await provider.stop()
  }
}, 30_000)

test('half of all provider answers lost under load, 3 retrying clients per key: one payment and one charge per key', async () => {
  const server = await startServer(db.url, { PAYMENT_PROVIDER_LOST_RESPONSE_RATE: '0.5', PAYMENT_PROVIDER_DELAY_MS: '20' })
  try {
    const results = new Map<string, Attempt[]>()
    const customers = new Map<string, string>()
    await Promise.all(Array.from({ length: 30 }, async (_, i) => {
      const key = `lossy-${i}-${crypto.randomUUID()}`
      customers.set(key, newCustomer(`lossy${i}`))
      const all = await Promise.all([0, 1, 2].map(() => payUntilAnswered(key, payment({ customer: customers.get(key)! }), { url: () => server.url, pauseMs: 50 })))
      results.set(key, all.flat())
    }))
    console.log(`lost answers (rate 0.5), 3 clients per key: ${JSON.stringify(tally(results.values()))}`)
    const payments = await paymentsByKey(db.sql)
    expect(exactlyOnce(results, new Map([...payments].filter(([key]) => results.has(key))))).toEqual([])
    expect(await chargedOnce(db.sql, server.provider, customers)).toEqual([])
  } finally {
    await server.stop()
  }
}, 60_000)

test('SIGKILL of the service while the provider is charging: after the TTL the retry reclaims and gets that same charge', async () => {
  const provider = await startProvider({ delayMs: 1_500 })
  const env = { IDEMPOTENCY_TTL_SECONDS: '2' }
  let server: ServerProcess = await startServer(db.url, env, { provider })
  try {
    const key = `killed-${crypto.randomUUID()}`
    const customer = newCustomer('killed')
    const first = postPayment(server.url, payment({ customer }), { key }).catch(() => 'lost')
    await waitFor(() => provider.pending() === 1, 'the charge to reach the provider')
    server.proc.kill('SIGKILL')
    await server.proc.exited
    expect(await first).toBe('lost')
    // The provider finishes the charge its caller no longer waits for.
    await waitFor(async () => (await provider.charges(customer)).length === 1, 'the provider to record the orphaned charge')
    const [stranded] = await db.sql`select status from idempotency_key_states where key = ${key}`
    expect(stranded!.status).toBe('processing')

    server = await startServer(db.url, env, { provider })
    const attempts = await payUntilAnswered(key, payment({ customer }), { url: () => server.url, pauseMs: 300 })
    const answered = attempts.at(-1)!
    expect(answered.status).toBe(201)
    const charges = await provider.charges(customer)
    expect(charges).toHaveLength(1)
    expect(await paymentRef(key)).toBe(charges[0]!.id)
    const [row] = await db.sql`select status, attempts from idempotency_key_states where key = ${key}`
    expect(row).toMatchObject({ status: 'done', attempts: 2 }) // reclaimed once
  } finally {
    if (server.proc.exitCode === null) await server.stop()
    await provider.stop()
  }
}, 40_000)

test('the same key and body from two tenants: two payments, two charges', async () => {
  const server = await startServer(db.url)
  try {
    const key = `shared-${crypto.randomUUID()}`
    const customer = newCustomer('shared')
    const [acme, globex] = await Promise.all([
      postPayment(server.url, payment({ customer }), { key, apiKey: 'acme-key' }),
      postPayment(server.url, payment({ customer }), { key, apiKey: 'globex-key' }),
    ])
    expect([acme.status, globex.status]).toEqual([201, 201])
    const charges = await server.provider.charges(customer)
    expect(charges).toHaveLength(2)
    const refs = [await paymentRef(key, 'acme'), await paymentRef(key, 'globex')]
    expect(new Set<string | undefined>(charges.map((c) => c.id))).toEqual(new Set(refs))
  } finally {
    await server.stop()
  }
}, 30_000)
