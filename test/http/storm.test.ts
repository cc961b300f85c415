/**
 * Exactly once and No blocked connections (docs/explanation/invariants.md) under a storm: many concurrent retries of one key over
 * real HTTP, against the service as a process. The naive baseline gets the
 * same storm and must break, which proves the storm reaches the race window.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startNaiveServer } from '../support/naive'
import { startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { waitFor } from '../support/wait'

let db: TestDatabase
/** The slow server's provider: a storm's first charge is held there until every other request of the storm has its answer. */
let provider: GatedProvider
let slow: ServerProcess
let fast: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('storm')
  provider = await startGatedProvider()
  ;[slow, fast] = await Promise.all([
    startServer(db.url, {}, { provider }),
    startServer(db.url),
  ])
})
afterAll(async () => {
  await Promise.all([slow?.stop(), fast?.stop()])
  await provider?.stop()
  await db?.drop()
})

interface Answer { status: number; id?: string; at: number; replayed: boolean; retryAfter: string | null }

async function storm(url: string, key: string, n: number, body: object = payment(), onAnswer = () => {}): Promise<Answer[]> {
  return Promise.all(Array.from({ length: n }, async () => {
    const response = await postPayment(url, body, { key })
    const text = await response.text()
    const parsed = response.ok ? (JSON.parse(text) as { id: string }) : undefined
    onAnswer()
    return {
      status: response.status,
      ...(parsed ? { id: parsed.id } : {}),
      at: performance.now(),
      replayed: response.headers.get('idempotent-replayed') === 'true',
      retryAfter: response.headers.get('retry-after'),
    }
  }))
}

async function paymentsFor(key: string): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from payments where idempotency_key = ${key} and tenant = 'acme'`
  return row!.n
}

describe('same-key storm', () => {
  for (const n of [50, 300]) {
    test(`${n} concurrent requests with one key: one payment, one charge, the rest 409 at once`, async () => {
      const key = `storm-${n}-${crypto.randomUUID()}`
      const customer = `cus_storm_${crypto.randomUUID().slice(0, 8)}`
      // The first charge waits at the provider until all the others are answered:
      // every request of the storm lands while the first is processing, on any
      // machine, and a retry that waits for the first would never be answered.
      provider.hold(1)
      let answered = 0
      const stormed = storm(slow.url, key, n, payment({ customer }), () => answered++)
      await waitFor(() => answered === n - 1 && provider.held() === 1,
        () => `${n - 1} of ${n} requests answered while the first is held at the provider (${answered} so far)`, 30_000)
      provider.release()
      const answers = await stormed
      const statuses = answers.map((a) => a.status)
      const created = answers.filter((a) => a.status === 201)
      const conflicts = answers.filter((a) => a.status === 409)
      console.log(`storm ${n}: ${created.length}x201, ${conflicts.length}x409, others: ${statuses.filter((s) => s !== 201 && s !== 409).join(',') || 'none'}`)

      expect(statuses.filter((s) => s >= 500)).toEqual([])
      expect(await paymentsFor(key)).toBe(1)
      expect(new Set(created.map((a) => a.id)).size).toBe(1)
      expect(created.filter((a) => !a.replayed)).toHaveLength(1)
      // Catches a claim that waits: a retry that blocked until the first finished comes back as a replay.
      expect(created.filter((a) => a.replayed)).toHaveLength(0)
      expect(created.length + conflicts.length).toBe(n)
      // Exactly once where it counts: the provider recorded one charge, the one the payment names.
      const charges = await slow.provider.charges(customer)
      expect(charges.map((c) => c.id)).toEqual([(await db.sql`select provider_ref from payments where idempotency_key = ${key}`)[0]!.provider_ref])
      expect(conflicts.every((a) => Number(a.retryAfter) >= 1)).toBe(true)
      // No 409 waited for the worker: every one came back before the payment did.
      const paid = created.find((a) => !a.replayed)!.at
      expect(conflicts.every((a) => a.at < paid)).toBe(true)
    })
  }

  test('the naive check-then-insert baseline breaks under the same storm', async () => {
    const naive = await startNaiveServer(db.url, 50)
    try {
      const key = `naive-${crypto.randomUUID()}`
      await storm(naive.url, key, 50)
      const duplicates = await paymentsFor(key)
      console.log(`naive baseline: ${duplicates} payments for one key`)
      expect(duplicates).toBeGreaterThan(1)
    } finally {
      await naive.stop()
    }
  })
})

test('200 keys x 10 concurrent retries: 200 payments, one id per key, no 5xx', async () => {
  const keys = Array.from({ length: 200 }, (_, i) => `many-${i}-${crypto.randomUUID()}`)
  const customer = `cus_${crypto.randomUUID().slice(0, 8)}`
  const answers = await Promise.all(keys.flatMap((key, i) =>
    Array.from({ length: 10 }, async () => {
      const response = await postPayment(fast.url, payment({ customer, amount: i + 1 }), { key })
      const text = await response.text()
      const parsed = JSON.parse(text) as { id?: string; code?: string; detail?: string }
      return { key, status: response.status, id: response.ok ? parsed.id : undefined, ...(response.ok ? {} : { problem: `${parsed.code}: ${parsed.detail}` }) }
    })))
  expect(answers.filter((a) => a.status >= 500)).toEqual([])
  expect(answers.every((a) => a.status === 201 || a.status === 409)).toBe(true)
  const [paid] = await db.sql<{ n: number }[]>`select count(*)::int as n from payments where customer = ${customer}`
  expect(paid!.n).toBe(200)
  const charges = await fast.provider.charges(customer)
  expect(charges).toHaveLength(200)
  const refs = await db.sql<{ provider_ref: string }[]>`select provider_ref from payments where customer = ${customer}`
  expect(new Set(charges.map((c) => c.id))).toEqual(new Set(refs.map((r) => r.provider_ref)))
  const [duplicated] = await db.sql<{ dupes: number }[]>`
    select count(*)::int as dupes from (select idempotency_key from payments where customer = ${customer} group by 1 having count(*) > 1) d`
  expect(duplicated!.dupes).toBe(0)
  for (const key of keys) {
    const ids = new Set(answers.filter((a) => a.key === key && a.id).map((a) => a.id))
    expect(ids.size).toBe(1)
  }
})
