/**
 * The bench's yardstick (bench/naive-app.ts) is what it claims to be: a
 * working payments app, and the naive one. Fresh keys each make one payment
 * and one charge, a sequential retry replays; concurrent retries of one key
 * through a slow provider each insert a payment, which the service never does
 * (test/http/storm.test.ts). If it stopped breaking, the bench would compare
 * against something that is not doing it wrong.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startProvider, type ProviderHandle } from '../support/server'
import { NAIVE_API_KEY, startNaiveApp, type NaiveApp } from '../../bench/naive-process'

let db: TestDatabase
let provider: ProviderHandle
let naive: NaiveApp
beforeAll(async () => {
  db = await createTestDatabase('naive_app')
  provider = await startProvider({ delayMs: 150 })
  naive = await startNaiveApp(db.url, provider.url)
})
afterAll(async () => {
  await naive?.stop()
  await provider?.stop()
  await db?.drop()
})

const post = (path: string, key: string | undefined, customer: string) => fetch(`${naive.url}${path}`, {
  method: 'POST',
  headers: { authorization: `Bearer ${NAIVE_API_KEY}`, 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
  body: JSON.stringify({ amount: 1000, currency: 'EUR', customer }),
})

test('fresh keys: one payment and one charge each; a retry after the answer replays it', async () => {
  const customer = `cus_naive_${crypto.randomUUID().slice(0, 8)}`
  const first = await post('/payments', 'naive-one', customer)
  expect(first.status).toBe(201)
  const again = await post('/payments', 'naive-one', customer)
  expect(await again.text()).toBe(await first.text())
  expect(await provider.charges(customer)).toHaveLength(1)
  expect((await post('/payments', undefined, customer)).status).toBe(400)
  expect((await fetch(`${naive.url}/payments`, { method: 'POST', body: '{}' })).status).toBe(401)
})

test('the same key sent 20 times at once makes more than one payment: check-then-insert races (the provider, given one downstream key, charges once)', async () => {
  const customer = `cus_naive_storm_${crypto.randomUUID().slice(0, 8)}`
  const answers = await Promise.all(Array.from({ length: 20 }, () => post('/payments', 'naive-storm', customer)))
  expect(answers.every((answer) => answer.status === 201)).toBe(true)
  const charges = await provider.charges(customer)
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from naive_payments where customer = ${customer}`
  console.log(`naive storm: ${row!.n} payments, ${charges.length} charges for one key`)
  expect(row!.n).toBeGreaterThan(1)
})

test('the baseline route charges every time: no idempotency at all', async () => {
  const customer = `cus_baseline_${crypto.randomUUID().slice(0, 8)}`
  for (let i = 0; i < 3; i++) expect((await post('/baseline', undefined, customer)).status).toBe(201)
  expect(await provider.charges(customer)).toHaveLength(3)
})
