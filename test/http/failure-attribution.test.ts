/**
 * A failure is answered and logged by where it happened, not by what its code
 * looks like. The route's own code (its `act`, its recording step) failing on
 * its own network or its own database (ECONNREFUSED, ECONNRESET, a terminated
 * backend of the app's own pool) is the route's failure: 500 `internal`, one
 * line "the route's act failed: ...", the key released so a retry runs again.
 * Only the engine's statements (claim, completion, release, the transaction
 * it hands `record`) answer `database-unavailable` or the lock-timeout answer.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createServer, type Server, type Socket } from 'node:net'
import postgres from 'postgres'
import { Elysia } from 'elysia'
import { idempotentPost, type IdempotencyPools, type IdempotentRoute } from '../../src/http/idempotency'
import { openPools } from '../../src/store/db'
import { createLogger } from '../../src/log'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startApp } from '../support/app'
import { payment, paymentRequest } from '../support/http'
import { lockTable } from '../support/table-lock'
import { waitFor } from '../support/wait'

type Line = Record<string, unknown> & { level: string; msg: string }
interface Order { item: string }

let db: TestDatabase
/** Every line the plugins of this file logged, parsed. */
const lines: Line[] = []
const log = createLogger({ level: 'debug', sink: (line) => lines.push(JSON.parse(line) as Line) })
const about = (requestId: string) => lines.filter((line) => line.request_id === requestId)

/** A port nothing listens on: taken from the system, then given back. */
async function closedPort(): Promise<number> {
  const listener = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const { port } = listener
  listener.stop(true)
  return port
}

/** A backend that accepts the connection and destroys it as soon as the request arrives: the client sees ECONNRESET. */
let resetter: Server
let resetterUrl: string
/** The app's own database pool (not the engine's): one whose backend is terminated under the query, one already ended. */
let own: postgres.Sql
let ended: postgres.Sql
let refusedUrl: string

beforeAll(async () => {
  db = await createTestDatabase('attribution')
  await db.sql`create table ledger (id serial primary key, item text not null)`
  refusedUrl = `http://127.0.0.1:${await closedPort()}/charge`
  resetter = createServer((socket: Socket) => socket.on('data', () => socket.destroy()))
  await new Promise<void>((resolve) => resetter.listen(0, '127.0.0.1', resolve))
  resetterUrl = `http://127.0.0.1:${(resetter.address() as { port: number }).port}/charge`
  own = postgres(db.url, { max: 1, onnotice: () => undefined })
  ended = postgres(db.url, { max: 1, onnotice: () => undefined })
  await ended`select 1`
  await ended.end()
})
afterAll(async () => {
  resetter?.close()
  await own?.end({ timeout: 1 })
  await db?.drop()
})

/** An app whose route is `route` (on the test database's pools unless given), logging into `lines`. */
function appOf(route: Omit<IdempotentRoute<Order, unknown>, 'validate'>, options: { ttlSeconds?: number; pools?: IdempotencyPools } = {}) {
  // Made at the first request: the test database is there by then.
  let app: Elysia | undefined
  const make = () => new Elysia().use(idempotentPost({ pools: options.pools ?? db.pools, tenant: () => 't1', ttlSeconds: options.ttlSeconds ?? 5, log }, {
    validate: (body) => ({ ok: true, value: body as Order }),
    ...route,
  })) as unknown as Elysia
  return (path: string, key: string, requestId: string) => (app ??= make()).handle(new Request(`http://attribution.test${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-request-id': requestId },
    body: JSON.stringify({ item: 'book' }),
  }))
}

const keyRow = async (key: string) =>
  (await db.sql<{ status: string; release_reason: string | null }[]>`select status, release_reason from idempotency_key_states where tenant = 't1' and key = ${key}`)[0]

describe('the route\'s act fails on its own backend: 500 internal, logged as the route\'s, the key released and run again', () => {
  /** What each act does on its first run (a retry of the same key then succeeds), and what it fails with. */
  // A terminated backend reaches postgres.js as its FATAL 57P01, or as the socket closing first (CONNECTION_CLOSED).
  const faults: Record<string, { what: string; run: () => Promise<unknown>; code: RegExp }> = {
    refused: { what: 'a fetch refused (ECONNREFUSED, a closed port)', run: () => fetch(refusedUrl, { method: 'POST', body: '{}' }), code: /^ECONNREFUSED$/ },
    reset: { what: 'a fetch reset (ECONNRESET, a server that destroys the socket)', run: () => fetch(resetterUrl, { method: 'POST', body: '{}' }), code: /^ECONNRESET$/ },
    terminated: { what: 'a query of the app\'s own pool whose backend is terminated (57P01)', run: () => own`select pg_terminate_backend(pg_backend_pid())`, code: /^(57P01|CONNECTION_CLOSED)$/ },
    ended: { what: 'a query of the app\'s own pool, already ended (CONNECTION_ENDED)', run: () => ended`select 1`, code: /^CONNECTION_ENDED$/ },
  }
  const runs = new Map<string, number>()
  const post = appOf({
    path: '/orders',
    async act({ key }) {
      const run = (runs.get(key) ?? 0) + 1
      runs.set(key, run)
      if (run === 1) await faults[key.slice(0, key.indexOf('.'))]!.run()
      return { run }
    },
    recordRows: ({ result }) => ({ status: 201, body: result, insert: {} }),
  })

  for (const [name, fault] of Object.entries(faults)) {
    test(fault.what, async () => {
      const key = `${name}.${crypto.randomUUID()}`
      const requestId = `act-${crypto.randomUUID()}`
      const failed = await post('/orders', key, requestId)
      expect({ status: failed.status, body: await failed.json() }).toMatchObject({
        status: 500,
        body: { code: 'internal', type: 'urn:idempotent-post:problem:internal', detail: 'Processing failed; the idempotency key was released, so a retry runs again.' },
      })
      const [line, ...more] = about(requestId)
      expect(more).toEqual([])
      expect(line).toMatchObject({ level: 'error', outcome: 'failed', key_state: 'released', failed_in: 'act', error: { code: expect.stringMatching(fault.code) } })
      expect(line!.msg).toStartWith('the route\'s act failed: ')
      expect(line!.msg).not.toContain('database')
      expect(await keyRow(key)).toEqual({ status: 'released', release_reason: 'failed' })

      // The key was released: the same request runs its act again, and this time succeeds.
      const retry = await post('/orders', key, `${requestId}-retry`)
      expect({ status: retry.status, body: await retry.json() }).toEqual({ status: 201, body: { run: 2 } })
      expect(runs.get(key)).toBe(2)
    })
  }

  test('the route\'s own query waiting on a lock (55P03 on its own pool) is the route\'s failure too, not the lock-timeout answer', async () => {
    const impatient = postgres(db.url, { max: 1, onnotice: () => undefined, connection: { lock_timeout: 100 } })
    const lock = await lockTable(db.sql, 'ledger')
    try {
      const lockedPost = appOf({
        path: '/locked',
        act: () => impatient`insert into ledger (item) values ('x')`,
        recordRows: () => ({ status: 201, body: {}, insert: {} }),
      })
      const requestId = `lock-${crypto.randomUUID()}`
      const key = `lock-${crypto.randomUUID()}`
      const failed = await lockedPost('/locked', key, requestId)
      expect({ status: failed.status, retryAfter: failed.headers.get('retry-after'), code: (await failed.json()).code }).toEqual({ status: 500, retryAfter: null, code: 'internal' })
      expect(about(requestId)).toEqual([expect.objectContaining({ level: 'error', key_state: 'released', error: expect.objectContaining({ code: '55P03' }) })])
      expect(await keyRow(key)).toEqual({ status: 'released', release_reason: 'failed' })
    } finally {
      await lock.release()
      await impatient.end({ timeout: 1 })
    }
  })
})

describe('the route\'s recording step fails on its own network: the route\'s failure, run once, not retried as a database fault', () => {
  for (const form of ['record', 'recordRows'] as const) {
    test(`${form}: a fetch refused inside it is 500 internal, the key released`, async () => {
      let recorded = 0
      const failing = async () => {
        recorded++
        await fetch(refusedUrl, { method: 'POST', body: '{}' })
        return { status: 201, body: {} }
      }
      const post = appOf(form === 'record'
        ? { path: `/rec-${form}`, act: async () => 1, record: failing }
        : { path: `/rec-${form}`, act: async () => 1, recordRows: async () => ({ ...(await failing()), insert: {} }) }, { ttlSeconds: 2 })
      const key = `rec-${crypto.randomUUID()}`
      const requestId = `rec-${crypto.randomUUID()}`
      const failed = await post(`/rec-${form}`, key, requestId)
      expect({ status: failed.status, code: (await failed.json()).code }).toEqual({ status: 500, code: 'internal' })
      expect(about(requestId)).toEqual([expect.objectContaining({ level: 'error', msg: expect.stringMatching(new RegExp(`^the route's ${form} failed: ECONNREFUSED`)), key_state: 'released' })])
      expect(recorded).toBe(1)
      expect(await keyRow(key)).toEqual({ status: 'released', release_reason: 'failed' })
    })
  }
})

describe('the engine\'s own statements: their faults are the database\'s', () => {
  test('a statement through the transaction the engine hands `record` that waits on a lock: the lock-timeout answer (503, Retry-After), not the route\'s 500', async () => {
    let recorded = 0
    const post = appOf({
      path: '/tx-locked',
      act: async () => 1,
      async record({ tx }) {
        recorded++
        await tx`insert into ledger (item) values ('locked')`
        return { status: 201, body: {} }
      },
    }, { ttlSeconds: 2 })
    const lock = await lockTable(db.sql, 'ledger')
    try {
      const key = `txlock-${crypto.randomUUID()}`
      const requestId = `txlock-${crypto.randomUUID()}`
      const failed = await post('/tx-locked', key, requestId)
      expect({ status: failed.status, retryAfter: failed.headers.get('retry-after'), code: (await failed.json()).code }).toEqual({ status: 503, retryAfter: '1', code: 'database-unavailable' })
      const [line, ...more] = about(requestId)
      expect(more).toEqual([])
      expect(line!.msg).not.toStartWith('the route\'s')
      expect(line).toMatchObject({ key_state: 'released' })
      expect(recorded).toBeGreaterThanOrEqual(1)
      expect(await keyRow(key)).toEqual({ status: 'released', release_reason: 'failed' })
    } finally {
      await lock.release()
    }
  })

  test('so is a statement through a savepoint of that transaction: the savepoint works, and its lock wait is the lock-timeout answer', async () => {
    const post = appOf({
      path: '/tx-savepoint',
      act: async () => 1,
      async record({ tx }) {
        const [row] = await tx.savepoint((sp) => sp<{ id: number }[]>`insert into ledger (item) values ('savepoint') returning id`)
        return { status: 201, body: { id: row!.id } }
      },
    }, { ttlSeconds: 2 })
    const done = await post('/tx-savepoint', `sp-${crypto.randomUUID()}`, `sp-${crypto.randomUUID()}`)
    expect(done.status).toBe(201)
    const lock = await lockTable(db.sql, 'ledger')
    try {
      const failed = await post('/tx-savepoint', `sp-${crypto.randomUUID()}`, `sp-${crypto.randomUUID()}`)
      expect({ status: failed.status, retryAfter: failed.headers.get('retry-after'), code: (await failed.json()).code }).toEqual({ status: 503, retryAfter: '1', code: 'database-unavailable' })
    } finally {
      await lock.release()
    }
  })

  test('the engine\'s pools closed while the act runs: 503 database-unavailable, logged as the database, the key left to be reclaimed', async () => {
    const pools = openPools(db.url, { applicationName: 'attribution-engine', shortMax: 2, workMax: 2 })
    let entered = false
    let proceed!: () => void
    const gate = new Promise<void>((resolve) => { proceed = resolve })
    const post = appOf({
      path: '/engine-down',
      async act() {
        entered = true
        await gate
        return 1
      },
      recordRows: () => ({ status: 201, body: {}, insert: {} }),
    }, { ttlSeconds: 1, pools })
    const key = `down-${crypto.randomUUID()}`
    const requestId = `down-${crypto.randomUUID()}`
    const answer = post('/engine-down', key, requestId)
    await waitFor(() => entered, 'the act to start (the key claimed)')
    await pools.close(0)
    proceed()
    const failed = await answer
    expect({ status: failed.status, code: (await failed.json()).code }).toEqual({ status: 503, code: 'database-unavailable' })
    const [line, ...more] = about(requestId)
    expect(more).toEqual([])
    expect(line).toMatchObject({ level: 'warn' })
    expect(line!.msg).toStartWith('database unavailable: ')
    // Neither completed nor released (the database took neither): it stays processing until its TTL, then a retry reclaims it.
    expect((await keyRow(key))!.status).toBe('processing')
  })
})

describe('the engine\'s database away at the claim, and the payments service\'s provider', () => {
  test('the engine\'s pools closed before the claim: 503 database-unavailable once the claim\'s 5 s bound passes, nothing run', async () => {
    const pools = openPools(db.url, { applicationName: 'attribution-claim', shortMax: 1, workMax: 1 })
    await pools.close(0)
    let acted = 0
    const post = appOf({ path: '/claim-down', act: async () => ++acted, recordRows: () => ({ status: 201, body: {}, insert: {} }) }, { pools })
    const key = `claimdown-${crypto.randomUUID()}`
    const requestId = `claimdown-${crypto.randomUUID()}`
    const failed = await post('/claim-down', key, requestId)
    expect({ status: failed.status, code: (await failed.json()).code, acted }).toEqual({ status: 503, code: 'database-unavailable', acted: 0 })
    const [line, ...more] = about(requestId)
    expect(more).toEqual([])
    expect(line).toMatchObject({ level: 'warn', key_state: 'claim failed (released under its lease if it committed)' })
    expect(line!.msg).toStartWith('database unavailable: ')
    expect(await keyRow(key)).toBeUndefined()
  }, 15_000)

  test('payments: a provider that refuses connections is still the catalogued provider-failed (502), logged as before', async () => {
    const url = `http://127.0.0.1:${await closedPort()}`
    const service = await startApp(db, { log, provider: { url, charges: async () => [], pending: () => 0, stop: async () => {} } })
    try {
      const key = `pay-${crypto.randomUUID()}`
      const failed = await service.handle(paymentRequest(service.url, payment({ customer: 'cus_refused' }), { key, headers: { 'x-request-id': `pay-${key}` } }))
      expect({ status: failed.status, body: await failed.json() }).toMatchObject({
        status: 502,
        body: { code: 'provider-failed', detail: 'the payment provider answer was lost 5 times; the idempotency key was released, so a retry runs again.' },
      })
      expect(about(`pay-${key}`)).toEqual([expect.objectContaining({
        level: 'warn', msg: 'provider_failed: the payment provider answer was lost 5 times', key_state: 'released', error: { name: 'ProviderError', code: 'PROVIDER_FAILED', message: 'the payment provider answer was lost 5 times' },
      })])
      expect((await db.sql`select status from idempotency_key_states where tenant = 'acme' and key = ${key}`)[0]).toEqual({ status: 'released' })
    } finally {
      await service.stop()
    }
  })
})
