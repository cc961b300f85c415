/**
 * Connection chaos between the gateway and PostgreSQL, under a storm in
 * front of json-server: a claim's and a completion's connection reset (RST)
 * before the server sees them, and a completion that commits and whose
 * answer is lost. The engine sends a claim or a completion again on a fresh
 * connection (re-read by its lease): no key makes a second record, every 2xx
 * for a key is that record, no answer is a 5xx but a 503 (database
 * unavailable, nothing forwarded), and every key ends done. Red with the
 * completion's recovery off: the reset completion's key stays held.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { openPools, type Pools } from '../../src/store/db'
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { waitFor } from '../support/wait'
import { startJsonServer, type JsonServer } from './support/json-server'
import { startHttpProxy, type HttpProxy } from './support/http-proxy'
import { post, read, startGateway, type TestGateway } from './support/gateway'

const KEYS = 30
const PER_KEY = 8

let upstream: JsonServer
let watch: HttpProxy
let database: TcpProxy
let db: TestDatabase
let pools: Pools
let gateway: TestGateway

beforeAll(async () => {
  upstream = await startJsonServer({ items: [] }, { delayMs: 20 })
  watch = await startHttpProxy(upstream.url)
  db = await createTestDatabase('gateway_faults')
  database = await startTcpProxy(db.url)
  pools = openPools(database.url, { applicationName: 'gateway-faults', shortMax: 10, workMax: 10 })
  gateway = await startGateway({ upstream: watch.url, db, pools })
})

afterAll(async () => {
  await gateway?.stop()
  await pools?.close(1)
  database?.stop()
  watch?.stop()
  await upstream?.stop()
  await db?.drop()
})

const CLAIM = /insert into idempotency_keys as k/
const COMPLETION = /done as \(\s*update idempotency_keys/

test('a claim and a completion reset, a completion\'s answer lost after its commit: at most one record per key, every 2xx is that record', async () => {
  const keys = Array.from({ length: KEYS }, (_, i) => `fault-${i}`)
  const send = (key: string) => post(gateway.url, '/items', { sku: 'fault', key }, { authorization: 'Bearer faults', 'idempotency-key': key }).then(read)
  // The first claim statement and the first completion never reach the server (RST); a later completion commits and its answer is lost.
  const claimReset = database.trap({ before: CLAIM, action: 'reset' })
  const completionReset = database.trap({ before: COMPLETION, action: 'reset' })
  const storm = Promise.all(keys.flatMap((key) => Array.from({ length: PER_KEY }, () => send(key))))
  await completionReset
  const lostAnswer = await database.trap({ before: COMPLETION, action: 'hold-reply' })
  await lostAnswer.reply!.complete
  lostAnswer.reply!.drop()
  lostAnswer.connection.reset()
  const answers = await storm
  await claimReset
  const statuses = new Map<number, number>()
  for (const answer of answers) statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1)
  console.log(`connection faults: a claim and a completion reset, a completion's answer lost, answers ${JSON.stringify(Object.fromEntries(statuses))}`)
  expect([...statuses.keys()].every((status) => status === 201 || status === 409 || status === 503)).toBe(true)

  // Once the faults stop, a retry of every key settles (a key whose completion was given up is held: 409 until its TTL).
  const settled = new Map<string, { status: number; text: string }>()
  await waitFor(async () => {
    for (const key of keys) if (settled.get(key)?.status !== 201) settled.set(key, await send(key))
    return [...settled.values()].every((answer) => answer.status === 201)
  }, () => `every key to answer 201 (${[...settled.values()].filter((answer) => answer.status === 201).length} of ${KEYS})`, 10_000, 300)
  const records = (await upstream.records()).filter((record) => record.sku === 'fault')
  const byKey = new Map<string, Record<string, unknown>[]>()
  for (const record of records) byKey.set(String(record.key), [...(byKey.get(String(record.key)) ?? []), record])
  for (const key of keys) expect(byKey.get(key)?.length).toBe(1)
  for (const answer of [...answers, ...settled.values()].filter((each) => each.status === 201)) {
    const body = JSON.parse(answer.text) as { id: number; key: string }
    expect(byKey.get(body.key)?.[0]?.id).toBe(body.id)
  }
  console.log(`connection faults: ${records.length} records for ${KEYS} keys`)
})
