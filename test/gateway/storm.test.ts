/**
 * The storm, against json-server (a server no one here wrote, which creates
 * a record per POST): one key sent 200 times at once over real HTTP.
 * Direct, the server makes 200 records; through the gateway, exactly one,
 * and every answer with it is the same bytes.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { waitFor } from '../support/wait'
import { startJsonServer, type JsonServer } from './support/json-server'
import { post, read, startGateway, type TestGateway } from './support/gateway'

const STORM = 200
const AUTH = { authorization: 'Bearer storm-client' }

let upstream: JsonServer
let gateway: TestGateway

beforeAll(async () => {
  upstream = await startJsonServer()
  gateway = await startGateway({ upstream: upstream.url })
})

afterAll(async () => {
  await gateway?.stop()
  await upstream?.stop()
})

async function keyStatus(key: string): Promise<string | undefined> {
  const [row] = await gateway.db.sql<{ status: string }[]>`select status from idempotency_key_states where key = ${key}`
  return row?.status
}

test('without the gateway: one key sent 200 times at once makes 200 records (json-server is not idempotent)', async () => {
  const before = (await upstream.records()).length
  const answers = await Promise.all(Array.from({ length: STORM }, () =>
    post(upstream.url, '/items', { sku: 'direct', qty: 1 }, { ...AUTH, 'idempotency-key': 'direct-1' }).then(read)))
  expect(answers.every((answer) => answer.status === 201)).toBe(true)
  const made = (await upstream.records()).filter((record) => record.sku === 'direct').length
  console.log(`direct to json-server: ${STORM} requests with one key -> ${made} records (${made - 1} duplicates)`)
  expect((await upstream.records()).length - before).toBe(STORM)
})

test('through the gateway: one key sent 200 times at once makes exactly one record; every answer for it is the same bytes', async () => {
  const key = 'storm-1'
  const body = { sku: 'gateway', qty: 1 }
  const answers = await Promise.all(Array.from({ length: STORM }, () =>
    post(gateway.url, '/items', body, { ...AUTH, 'idempotency-key': key }).then(read)))
  const statuses = new Map<number, number>()
  for (const answer of answers) statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1)
  console.log(`through the gateway: ${STORM} requests with one key -> statuses ${JSON.stringify(Object.fromEntries(statuses))}`)
  // Each answer is the record (201) or "in flight" (409 with Retry-After); nothing else.
  expect([...statuses.keys()].every((status) => status === 201 || status === 409)).toBe(true)
  for (const answer of answers.filter((each) => each.status === 409)) expect(Number(answer.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
  const created = answers.filter((answer) => answer.status === 201)
  expect(created.length).toBeGreaterThanOrEqual(1)
  // Every answer is in, the one forward's too: json-server has made its record(s).
  const made = (await upstream.records()).filter((record) => record.sku === 'gateway')
  console.log(`through the gateway: ${made.length} record(s) made`)
  expect(made.length).toBe(1)

  await waitFor(async () => await keyStatus(key) === 'done', `key ${key} to be done`)
  // The clients that were told 409 retry: each gets the stored answer.
  const retries = await Promise.all(answers.filter((answer) => answer.status === 409).map(() =>
    post(gateway.url, '/items', body, { ...AUTH, 'idempotency-key': key }).then(read)))
  const all = [...created, ...retries]
  expect(all.length).toBe(STORM)
  const first = created[0]!
  for (const answer of all) {
    expect(answer.status).toBe(201)
    expect(answer.text).toBe(first.text)
    expect(answer.headers.get('location')).toBe(first.headers.get('location'))
    expect(answer.headers.get('content-type')).toBe(first.headers.get('content-type'))
  }
  expect(retries.every((answer) => answer.headers.get('idempotent-replayed') === 'true')).toBe(true)
  const records = (await upstream.records()).filter((record) => record.sku === 'gateway')
  expect(records.length).toBe(1)
  expect(JSON.parse(first.text).id).toBe(records[0]!.id)
})

test('through the gateway: 40 keys sent 5 times each at once make 40 records, one per key', async () => {
  const keys = Array.from({ length: 40 }, (_, i) => `many-${i}`)
  await Promise.all(keys.flatMap((key) => Array.from({ length: 5 }, () =>
    post(gateway.url, '/items', { sku: 'many', key }, { ...AUTH, 'idempotency-key': key }).then(read))))
  await waitFor(async () => {
    const [row] = await gateway.db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where key like 'many-%' and status = 'done'`
    return row!.n === keys.length
  }, '40 keys done')
  const records = (await upstream.records()).filter((record) => record.sku === 'many')
  expect(records.length).toBe(keys.length)
  expect(new Set(records.map((record) => record.key)).size).toBe(keys.length)
})
