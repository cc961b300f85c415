/**
 * Three service instances behind HAProxy (round robin, /readyz checks),
 * sharing one PostgreSQL, so a storm for one key really spreads across
 * processes that share nothing but the database. Then one instance is
 * SIGKILLed in the middle of a storm: exactly once still holds in the
 * payments table and in the provider's ledger. (409 latency through HAProxy
 * is a figure of `npm run bench:scale`, not asserted: this machine is shared.)
 *
 * The database is a private PostgreSQL made by the test (initdb): three
 * instances hold up to 3 x 18 connections, and the machine's server
 * (max_connections 100) is shared with every other suite.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type postgres from 'postgres'
import { createDatabase, type OwnDatabase } from './support/database'
import { HAProxy } from './support/haproxy'
import { PostgresServer } from './support/postgres-server'
import { cleanupAll, missing } from './support/processes'
import { waitUntil } from '../support/wait'
import { ms, paidId, percentile, storm, tally, untilPaid, type Answer } from './support/load'
import { adminClient, checkLedgers, providerWired, report, startInstance, startProvider, type Instance, type Provider } from './support/world'

const skip = missing(['haproxy', 'initdb', 'postgres'])
if (skip) console.log(`[scale] haproxy: ${skip}`)

/** The whole storm lands while the first request is still at the provider. */
const PROVIDER_DELAY_MS = 800
const INSTANCES = 3

describe.skipIf(skip !== undefined)('three instances behind HAProxy, one PostgreSQL', () => {
  let pg: PostgresServer
  let db: OwnDatabase
  let sql: postgres.Sql
  let provider: Provider
  let instances: Instance[]
  let proxy: HAProxy
  const wired = providerWired()

  beforeAll(async () => {
    pg = PostgresServer.init('haproxy-pg')
    await pg.start()
    db = await createDatabase('haproxy', pg.url())
    sql = adminClient(db.url)
    provider = await startProvider(PROVIDER_DELAY_MS)
    instances = await Promise.all(Array.from({ length: INSTANCES }, (_, i) =>
      startInstance(`s${i + 1}`, { databaseUrl: db.url, providerUrl: provider.url, ttlSeconds: 3 })))
    proxy = await HAProxy.start(instances.map((i) => ({ name: i.name, port: i.port })))
  }, 120_000)

  afterAll(async () => {
    await sql?.end({ timeout: 1 })
    await cleanupAll()
  })

  test('storm: 300 concurrent requests with one key across 3 instances, one payment, one charge', async () => {
    const key = `ha-storm-${crypto.randomUUID()}`
    const customer = `cus_ha_storm_${crypto.randomUUID().slice(0, 8)}`
    const answers = await storm(proxy.url, key, 300, { amount: 1250, currency: 'EUR', customer })
    const created = answers.filter((a) => a.status === 201 && !a.replayed)
    const conflicts = answers.filter((a) => a.status === 409)
    const ledger = await checkLedgers(sql, provider, new Map([[key, { customer, ...(created[0]?.id ? { answeredId: created[0].id } : {}) }]]))
    const spread = await sql<{ application_name: string; n: number }[]>`
      select application_name, count(*)::int as n from pg_stat_activity where datname = ${db.name} group by 1 order by 1`
    report('haproxy storm 300x1', {
      answers: JSON.stringify(tally(answers)), payments: ledger.payments, charges: ledger.charges, lost: ledger.lost,
      duplicated: ledger.duplicatedPayments + ledger.duplicatedCharges,
      '409 p50': ms(percentile(conflicts.map((a) => a.ms), 50)), '409 p99': ms(percentile(conflicts.map((a) => a.ms), 99)),
      '201 ms': created[0] ? ms(created[0].ms) : undefined,
      connections: spread.map((r) => `${r.application_name}:${r.n}`).join(','),
    })
    expect(created).toHaveLength(1)
    expect(answers.every((a) => a.status === 409 || (a.status === 201 && a.id === created[0]!.id))).toBe(true)
    expect(ledger).toMatchObject({ payments: 1, duplicatedPayments: 0 })
    if (wired) expect(ledger).toMatchObject({ charges: 1, duplicatedCharges: 0, unmatchedReferences: 0 })
  }, 120_000)

  test('storm: 200 keys x 10 concurrent requests, one instance SIGKILLed mid-storm: 200 payments, 200 charges', async () => {
    const run = crypto.randomUUID().slice(0, 8)
    const keys = Array.from({ length: 200 }, (_, i) => ({ key: `ha-many-${run}-${i}`, customer: `cus_ha_many_${run}_${i}`, amount: 300 + i }))
    const victim = instances[1]!
    let killedAt = 0
    // Every one of the 10 requests per key is a careful client: it retries
    // what failed (the killed instance's 502s, 409s) until it gets a 2xx.
    const load = Promise.all(keys.map(async ({ key, customer, amount }) => ({
      key,
      clients: await Promise.all(Array.from({ length: 10 }, () => untilPaid(() => proxy.url, key, { amount, currency: 'EUR', customer }, { pauseMs: 300, deadlineMs: 120_000 }))),
    })))
    const chaos = (async () => {
      // Kill once the storm is in flight: keys in processing on every instance.
      await waitUntil(async () => (await sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing' and key like ${`ha-many-${run}-%`}`)[0]!.n >= 50, 10_000, 20)
      const [row] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing' and key like ${`ha-many-${run}-%`}`
      await victim.kill()
      killedAt = performance.now()
      return row!.n
    })()
    const [results, processingAtKill] = await Promise.all([load, chaos])
    const all = results.flatMap((r) => r.clients.flat())
    const expected = new Map(keys.map(({ key, customer }) => {
      const clients = results.find((r) => r.key === key)!.clients
      const ids = new Set(clients.map(paidId))
      expect([key, ids.size]).toEqual([key, 1])
      return [key, { customer, answeredId: paidId(clients[0]!)! }]
    }))
    const ledger = await checkLedgers(sql, provider, expected)
    const conflicts = all.filter((a) => a.status === 409)
    const afterKill = all.filter((a) => a.at > killedAt)
    report('haproxy storm 200x10 + SIGKILL of 1 of 3', {
      'processing at kill': processingAtKill, answers: JSON.stringify(tally(all)), 'after kill': JSON.stringify(tally(afterKill)),
      payments: ledger.payments, charges: ledger.charges, lost: ledger.lost, missing: ledger.missing,
      duplicated: ledger.duplicatedPayments + ledger.duplicatedCharges,
      '409 p50': ms(percentile(conflicts.map((a) => a.ms), 50)), '409 p99': ms(percentile(conflicts.map((a) => a.ms), 99)),
    })
    expect(ledger).toMatchObject({ payments: 200, lost: 0, missing: 0, duplicatedPayments: 0 })
    if (wired) expect(ledger).toMatchObject({ charges: 200, duplicatedCharges: 0, unmatchedReferences: 0 })
    // Nothing but 2xx, 409, and what a dead instance causes (HAProxy's 502/503, a dropped connection).
    const odd = all.filter((a: Answer) => !(typeof a.status === 'string' || (a.status >= 200 && a.status < 300) || [409, 502, 503, 504].includes(a.status)))
    expect(odd.map((a) => a.status)).toEqual([])
    const [{ processing }] = await sql<{ processing: number }[]>`select count(*)::int as processing from idempotency_key_states where status = 'processing'` as unknown as [{ processing: number }]
    expect(processing).toBe(0)
  }, 240_000)
})
