/**
 * The key's new form (sql/engine/00020): the answer in a table of its own,
 * the request in flight in its processing entry, the key's row written once.
 * What the rest of the engine's tests check in either form (npm test runs
 * test/core again with TEST_KEY_FORM=new) is not repeated here; this file
 * checks what only the new form promises: a completion never updates the
 * key's row, its fence is the entry's lease, and a switch of the form
 * while keys are in flight loses none of them.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { completeRows } from '../../src/core/complete-rows'
import { LeaseLostError } from '../../src/core/errors'
import { KEY_STATES } from '../../src/core/key-states'
import { reclaim } from '../../src/core/reclaim'
import { newPayment } from '../../src/payments/insert-payment'
import type { ClaimResult, Lease, StoredResponse } from '../../src/core/types'
import { createTestDatabase, setKeyForm, type TestDatabase } from '../support/db'
import { identity, secondsAfter } from '../support/keys'

const TTL = 30
const timing = (now?: Date) => ({ ttlSeconds: TTL, retentionSeconds: 3600, now })
const answer = (n: number): StoredResponse => ({ status: 201, headers: { location: `/api/payments/${n}` }, body: `{"n":${n}}` })

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('answers-apart')
  await setKeyForm(db.url, 'new')
})
afterAll(async () => { await db?.drop() })

function leaseOf(result: ClaimResult): Lease {
  if (result.kind !== 'created' && result.kind !== 'reclaimed') throw new Error(`expected a lease, got ${result.kind}`)
  return result.lease
}

/** The key's row as stored (its form's columns), its version (xmin: a new one at each update), its entry and answer. */
async function stored(id: { tenant: string; key: string }) {
  const [row] = await db.sql<{ status: string | null; locked_at: Date | null; lease: string; version: string; entry_lease: string | null; answers: number }[]>`
    select k.status, k.locked_at, k.lease::text, k.xmin::text as version,
           (select pr.lease::text from idempotency_processing pr where pr.tenant = k.tenant and pr.key = k.key) as entry_lease,
           (select count(*)::int from idempotency_answers a where a.tenant = k.tenant and a.request_id = k.request_id) as answers
      from idempotency_keys k where k.tenant = ${id.tenant} and k.key = ${id.key}`
  return row!
}

const payments = async (key: string) =>
  (await db.sql<{ n: number }[]>`select count(*)::int as n from payments where idempotency_key = ${key}`)[0]!.n

/** The payment a completion of `lease` writes (the service's row). */
const paymentRow = (lease: Lease) => ({
  payments: [newPayment(lease.tenant, { amount: 100, currency: 'EUR', customer: 'c' }, `ch_${lease.lease}`, lease.key).row],
})

describe('a key of the new form', () => {
  test('is written once: its completion inserts the answer and deletes the entry, and never updates the row', async () => {
    const id = identity()
    const lease = leaseOf(await claim(db.pools.short, id, timing()))
    const claimed = await stored(id)
    expect({ status: claimed.status, locked_at: claimed.locked_at, entry_lease: claimed.entry_lease, answers: claimed.answers })
      .toEqual({ status: null, locked_at: null, entry_lease: lease.lease, answers: 0 })
    await completeRows(db.pools.short, lease, answer(1), paymentRow(lease))
    const done = await stored(id)
    expect({ version: done.version, entry_lease: done.entry_lease, answers: done.answers })
      .toEqual({ version: claimed.version, entry_lease: null, answers: 1 })
    expect(await payments(id.key)).toBe(1)
    const replay = await claim(db.pools.short, id, timing())
    expect(replay.kind === 'replay' && replay.response).toEqual({ ...answer(1) })
  })

  test('the transactional completion, too', async () => {
    const id = identity()
    const lease = leaseOf(await claim(db.pools.short, id, timing()))
    const before = await stored(id)
    await complete(db.pools.work, lease, async () => answer(2))
    expect(await stored(id)).toMatchObject({ version: before.version, entry_lease: null, answers: 1 })
  })

  test('a slow worker reclaimed past its deadline is fenced by the entry: neither completion form writes anything', async () => {
    for (const form of ['rows', 'transaction'] as const) {
      const id = identity()
      const start = new Date()
      const slow = leaseOf(await claim(db.pools.short, id, timing(start)))
      const taker = await reclaim(db.pools.short, slow, { ...timing(secondsAfter(start, TTL + 1)) })
      if (taker === null || taker === 'busy') throw new Error(`expected the reclaim to take the key, got ${taker}`)
      expect((await stored(id)).entry_lease).toBe(taker.lease)
      const late = form === 'rows'
        ? completeRows(db.pools.short, slow, answer(3), paymentRow(slow))
        : complete(db.pools.work, slow, async (tx) => {
          await tx`insert into payments ${tx(paymentRow(slow).payments[0]!)}`
          return answer(3)
        })
      await expect(late).rejects.toBeInstanceOf(LeaseLostError)
      expect({ payments: await payments(id.key), ...(await stored(id)) }).toMatchObject({ payments: 0, answers: 0, entry_lease: taker.lease })
      await completeRows(db.pools.short, taker, answer(4), paymentRow(taker))
      expect({ payments: await payments(id.key), answers: (await stored(id)).answers }).toEqual({ payments: 1, answers: 1 })
    }
  })
})

describe('an answer of the new form', () => {
  test('is stored without content-type when it is application/json, and replayed with exactly the headers it had', async () => {
    const cases: Record<string, string>[] = [
      { location: '/api/payments/1', 'content-type': 'application/json' },
      { 'content-type': 'text/plain; charset=utf-8' },
      { location: '/x' },
      {},
    ]
    for (const [n, headers] of cases.entries()) {
      for (const form of ['rows', 'transaction'] as const) {
        const id = identity()
        const lease = leaseOf(await claim(db.pools.short, id, timing()))
        const response = { status: 200 + n, headers, body: `{"n":${n}}` }
        if (form === 'rows') await completeRows(db.pools.short, lease, response, {})
        else await complete(db.pools.work, lease, async () => response)
        const replay = await claim(db.pools.short, id, timing())
        expect({ form, replayed: replay.kind === 'replay' && replay.response }).toEqual({ form, replayed: response })
        const [row] = await db.sql<{ headers: string }[]>`
          select a.response_headers as headers from idempotency_answers a join idempotency_keys k on k.tenant = a.tenant and k.request_id = a.request_id
           where k.tenant = ${id.tenant} and k.key = ${id.key}`
        if (headers['content-type'] === 'application/json') expect(row!.headers).not.toContain('content-type')
      }
    }
  })
})

describe('a location the answer\'s body spells (sql/engine/00024, 00025)', () => {
  /** The answer's headers as stored, for the key `id`. */
  const storedHeaders = async (id: { tenant: string; key: string }) => (await db.sql<{ headers: string }[]>`
    select a.response_headers as headers from idempotency_answers a join idempotency_keys k on k.tenant = a.tenant and k.request_id = a.request_id
     where k.tenant = ${id.tenant} and k.key = ${id.key}`)[0]!.headers

  /** Completes a fresh key with `response` (through the shared statement or the transaction), replays it; its stored headers. */
  async function roundTrip(response: StoredResponse, form: 'rows' | 'transaction') {
    const id = identity()
    const lease = leaseOf(await claim(db.pools.short, id, timing()))
    if (form === 'rows') await completeRows(db.pools.short, lease, response, {})
    else await complete(db.pools.work, lease, async () => response)
    const replay = await claim(db.pools.short, id, timing())
    const [viewed] = await db.sql<{ response_headers: Record<string, string> }[]>`
      select response_headers from idempotency_key_states where tenant = ${id.tenant} and key = ${id.key}`
    return { replayed: replay.kind === 'replay' && replay.response, viewed: viewed!.response_headers, stored: await storedHeaders(id) }
  }

  const created = (location: string, body: string): StoredResponse => ({ status: 201, headers: { location, 'content-type': 'application/json' }, body })

  test.each(['rows', 'transaction'] as const)('is stored without it and replayed with it, byte for byte (%s)', async (form) => {
    const response = created('/api/payments/pay_1', '{"id":"pay_1","amount":1000}')
    const { replayed, viewed, stored } = await roundTrip(response, form)
    expect(replayed).toEqual(response)
    expect(viewed).toEqual(response.headers)
    expect(stored).toBe('+{}')
  })

  test.each(['rows', 'transaction'] as const)('any other location is stored as it came (%s)', async (form) => {
    const cases: StoredResponse[] = [
      created('/api/payments/pay_2', '{"amount":1000,"id":"pay_2"}'), // the id not first
      created('/api/payments/other', '{"id":"pay_3"}'),
      created('https://example.com/api/payments/pay_4', '{"id":"pay_4"}'),
      created('/api/payments/a\\"b', '{"id":"a\\"b"}'), // an id with an escape
      created('/api/payments/', '{"id":""}'),
      { status: 201, headers: { 'content-type': 'application/json' }, body: '{"id":"pay_5"}' }, // no location at all
    ]
    for (const response of cases) {
      const { replayed, viewed, stored } = await roundTrip(response, form)
      expect({ body: response.body, replayed, viewed }).toEqual({ body: response.body, replayed: response, viewed: response.headers })
      expect({ body: response.body, marked: stored.startsWith('+') }).toEqual({ body: response.body, marked: false })
    }
  })

  test('with its other headers kept, and a body that is no JSON past its id', async () => {
    const response = { status: 201, headers: { location: '/api/payments/x-1', 'content-type': 'text/plain', 'x-trace': 't' }, body: '{"id":"x-1" and then not JSON' }
    for (const form of ['rows', 'transaction'] as const) {
      const { replayed, viewed, stored } = await roundTrip(response, form)
      expect({ form, replayed, viewed }).toEqual({ form, replayed: response, viewed: response.headers })
      expect(JSON.parse(stored.slice(1))).toEqual({ 'content-type': 'text/plain', 'x-trace': 't' })
    }
  })

  test('is stored whole until the contract step says every process rebuilds it', async () => {
    await db.sql`update idempotency_key_form set location_derived = false`
    try {
      const response = created('/api/payments/pay_6', '{"id":"pay_6"}')
      for (const form of ['rows', 'transaction'] as const) {
        const { replayed, stored } = await roundTrip(response, form)
        expect({ form, replayed, stored: JSON.parse(stored) }).toEqual({ form, replayed: response, stored: { location: '/api/payments/pay_6' } })
      }
    } finally {
      await db.sql`update idempotency_key_form set location_derived = true`
    }
  })
})

describe('switching the form while keys are in flight', () => {
  test('a key claimed in the old form completes in it; keys claimed after the switch take the new form; every one replays', async () => {
    const switching = await createTestDatabase('answers-apart-switch')
    await setKeyForm(switching.url, 'old')
    try {
      const oldId = identity()
      const oldLease = leaseOf(await claim(switching.pools.short, oldId, timing()))
      await setKeyForm(switching.url, 'new')
      const newId = identity()
      const newLease = leaseOf(await claim(switching.pools.short, newId, timing()))
      // A retry of the old key after the switch still sees it in flight.
      expect((await claim(switching.pools.short, oldId, timing())).kind).toBe('in_progress')
      await Promise.all([
        completeRows(switching.pools.short, oldLease, answer(5), {}),
        completeRows(switching.pools.short, newLease, answer(6), {}),
      ])
      const forms = await switching.sql<{ key: string; locked_at: Date | null; status: string | null; answers: number }[]>`
        select k.key, k.locked_at, k.status,
               (select count(*)::int from idempotency_answers a where a.tenant = k.tenant and a.request_id = k.request_id) as answers
          from idempotency_keys k where k.key in ${switching.sql([oldId.key, newId.key])}`
      const byKey = Object.fromEntries(forms.map((row) => [row.key, row]))
      expect({ status: byKey[oldId.key]!.status, old_form: byKey[oldId.key]!.locked_at !== null, answers: byKey[oldId.key]!.answers })
        .toEqual({ status: 'done', old_form: true, answers: 0 })
      expect({ status: byKey[newId.key]!.status, old_form: byKey[newId.key]!.locked_at !== null, answers: byKey[newId.key]!.answers })
        .toEqual({ status: null, old_form: false, answers: 1 })
      for (const [id, n] of [[oldId, 5], [newId, 6]] as const) {
        const replay = await claim(switching.pools.short, id, timing())
        expect(replay.kind === 'replay' && replay.response.body).toBe(`{"n":${n}}`)
      }
      const states = await switching.sql<{ status: string }[]>`
        select k.status from ${switching.sql.unsafe(KEY_STATES)} k where k.key in ${switching.sql([oldId.key, newId.key])}`
      expect(states.map((row) => row.status)).toEqual(['done', 'done'])
      // The operators' view (sql/engine/00020) reads both forms as the engine's statements do.
      const viewed = await switching.sql`select * from idempotency_key_states order by tenant, key`
      const engine = await switching.sql`select * from ${switching.sql.unsafe(KEY_STATES)} k order by k.tenant, k.key`
      expect(viewed).toEqual(engine)
      expect(viewed).toHaveLength(2)
    } finally {
      await switching.drop()
    }
  })
})
