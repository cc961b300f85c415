/**
 * Rows of SPEC.md's HTTP table at their edges (issue 16, item 5), through the
 * service's app in this process and a real PostgreSQL, as contract.test.ts:
 * - a lock not obtained in time is a failed request: 5xx (503 with
 *   Retry-After), the key released, never 409 "in progress";
 * - lengths count characters (Unicode code points), not UTF-16 units: an
 *   emoji is one character.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { json, payment, paymentRequest, type PostOptions } from '../support/http'
import { startProvider, type ProviderHandle } from '../support/server'
import { track, waitFor } from '../support/wait'

let db: TestDatabase
let provider: ProviderHandle
let server: InProcessService

beforeAll(async () => {
  db = await createTestDatabase('contract_edges')
  provider = await startProvider()
  server = await startApp(db, { provider })
})
afterAll(async () => {
  await server?.stop()
  await provider?.stop()
  await db?.drop()
})

function postPayment(body: unknown, options: PostOptions = {}): Promise<Response> {
  return server.handle(paymentRequest(server.url, body, options))
}

async function keyStatus(key: string): Promise<string | undefined> {
  const [row] = await db.sql<{ status: string }[]>`select status from idempotency_key_states where tenant = 'acme' and key = ${key}`
  return row?.status
}

/** One character each, two UTF-16 units each (U+1F600). */
const emoji = (count: number) => '\u{1F600}'.repeat(count)

describe('a lock not obtained in time', () => {
  // A completion that meets a lock is sent again while its deadline leaves time (invariant 15): a short TTL
  // makes that deadline come in a few seconds, so the lock below outlives it.
  let shortTtl: InProcessService
  beforeAll(async () => { shortTtl = await startApp(db, { provider, env: { IDEMPOTENCY_TTL_SECONDS: '3' } }) })
  afterAll(async () => { await shortTtl?.stop() })

  test('a payment INSERT whose lock outlives the request\'s deadline: 503 problem+json with Retry-After, not 409; the key is released, and a retry completes with the same charge', async () => {
    const key = `lock-timeout-${crypto.randomUUID()}`
    const body = payment({ customer: `cus_${key}` })
    // A DBA's (or a migration's) lock on payments, held past the service's 1 s lock_timeout and the request's deadline.
    const locker = await db.sql.reserve()
    let response: Response
    try {
      await locker`begin`
      await locker`lock table payments in access exclusive mode`
      const answer = track(shortTtl.handle(paymentRequest(shortTtl.url, body, { key })))
      await waitFor(async () => (await db.sql`
        select 1 from pg_stat_activity
         where datname = current_database() and wait_event_type = 'Lock' and query ~* 'insert into payments|done as [(][[:space:]]*update idempotency_keys'`).length === 1 || answer.settled(),
      'the completion\'s INSERT to wait on the lock')
      expect(answer.settled()).toBe(false)
      response = await answer.promise // the lock is still held: the service gave up waiting (55P03) at the deadline
    } finally {
      await locker`rollback`
      locker.release()
    }
    const problem = await json(response.clone())
    console.log(`[edges] lock_timeout on the payment INSERT: ${response.status} ${problem.code}, Retry-After ${response.headers.get('retry-after')}: ${problem.detail}`)
    expect({ status: response.status, type: response.headers.get('content-type')?.startsWith('application/problem+json') })
      .toEqual({ status: 503, type: true })
    expect(Number(response.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    expect(problem.status).toBe(503)
    expect(await keyStatus(key)).toBe('released')

    const retry = await postPayment(body, { key })
    expect(retry.status).toBe(201)
    const charges = await provider.charges(body.customer)
    expect(charges.length).toBe(1)
    expect((await json(retry)).provider_reference).toBe(charges[0]!.id)
  }, 20_000)
})

describe('lengths are characters, not UTF-16 units', () => {
  test('a customer of 40 emoji (40 characters, 80 UTF-16 units): 201, stored, charged and listed as sent', async () => {
    const customer = emoji(40)
    const key = `emoji-40-${crypto.randomUUID()}`
    const response = await postPayment(payment({ customer }), { key })
    expect(response.status).toBe(201)
    const created = await json(response)
    expect(created.customer).toBe(customer)
    expect((await provider.charges(customer)).length).toBe(1)
    const listed = await server.fetch(`/api/payments?customer=${encodeURIComponent(customer)}`, { headers: { authorization: 'Bearer acme-key' } })
    expect(listed.status).toBe(200)
    expect((await json(listed)).data.map((p: { id: string }) => p.id)).toContain(created.id)
  })

  test('a customer of 64 emoji is accepted (201), one of 65 characters is a 400 and stores nothing', async () => {
    expect((await postPayment(payment({ customer: emoji(64) }))).status).toBe(201)
    const key = `emoji-65-${crypto.randomUUID()}`
    const refused = await postPayment(payment({ customer: emoji(65) }), { key })
    expect(refused.status).toBe(400)
    expect(await keyStatus(key)).toBeUndefined()
  })

  test('a description of 500 emoji is accepted (201) and stored whole; one of 501 is a 400 and stores nothing', async () => {
    const description = emoji(500)
    const response = await postPayment(payment({ description }))
    expect(response.status).toBe(201)
    expect((await json(response)).description).toBe(description)
    const key = `emoji-501-${crypto.randomUUID()}`
    const refused = await postPayment(payment({ description: emoji(501) }), { key })
    expect(refused.status).toBe(400)
    expect(await keyStatus(key)).toBeUndefined()
  })
})

describe('a member named twice', () => {
  // Catches: a body whose repeated name JSON.parse settles silently (the last amount charged), and a count of
  // members fooled by colons, quotes and backslashes inside strings (a false 400 for an honest body).
  test('is a 400 that names the repetition, and stores and charges nothing', async () => {
    const key = `twice-${crypto.randomUUID()}`
    const refused = await postPayment('{"amount":100,"currency":"EUR","customer":"cus_twice","amount":200}', { key })
    expect(refused.status).toBe(400)
    expect(refused.headers.get('content-type')).toBe('application/problem+json')
    expect(await json(refused)).toMatchObject({ code: 'invalid-json', detail: 'An object names a member twice; send each name once.' })
    expect(await keyStatus(key)).toBeUndefined()
    expect(await provider.charges('cus_twice')).toEqual([])
  })

  test('colons, quotes and backslashes inside strings are not members: 201', async () => {
    const body = '{"amount":100,"currency":"EUR","customer":"c:\\"x\\":1\\\\","description":"a: b \\\\\\" c:d\\u003a"}'
    const response = await postPayment(body)
    expect(response.status).toBe(201)
    expect((await json(response)).description).toBe('a: b \\" c:d:')
  })
})
