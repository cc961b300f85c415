/**
 * The properties the capacity model in docs/explanation/scaling.md rests on (its figures
 * are measured by `npm run bench:scale`, not asserted):
 *
 * - a fresh payment takes at most two transaction ids (the claim, the
 *   completion; fewer when concurrent claims and completions share a batched
 *   statement) and nothing more: transaction-id use, and with it
 *   anti-wraparound vacuum, is at most 2 × payments (an extra write per
 *   request would show as a third);
 * - a replay and a 409 write nothing: no transaction id, no WAL (a claim that
 *   upserted, or touched the row, would show here);
 * - one instance opens at most 17 connections (short 8, work 8, health 1),
 *   whatever the load.
 *
 * On one instance and a private PostgreSQL (initdb), with exact counters: the
 * next transaction id (pg_current_snapshot) and the WAL position. The
 * instance's own background writes (its health probe, twice a second; its
 * heartbeat) are counted in, so each bound leaves them room, and no more.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type postgres from 'postgres'
import { createDatabase, type OwnDatabase } from './support/database'
import { post, type PaymentRequest } from './support/load'
import { PostgresServer } from './support/postgres-server'
import { cleanupAll, missing, waitFor } from './support/processes'
import { adminClient, report, startInstance, startProvider, type Instance, type Provider } from './support/world'

const skip = missing(['initdb', 'postgres'])
if (skip) console.log(`[scale] capacity: ${skip}`)

const CONCURRENCY = 32
const REQUESTS = 600

describe.skipIf(skip !== undefined)('capacity properties (one instance, a private PostgreSQL)', () => {
  let pg: PostgresServer
  let db: OwnDatabase
  let sql: postgres.Sql
  let provider: Provider
  let service: Instance

  beforeAll(async () => {
    pg = PostgresServer.init('capacity-pg')
    await pg.start()
    db = await createDatabase('capacity', pg.url())
    sql = adminClient(db.url)
    provider = await startProvider(0)
    service = await startInstance('capacity', { databaseUrl: db.url, providerUrl: provider.url, ttlSeconds: 300 })
  }, 120_000)

  afterAll(async () => {
    await sql?.end({ timeout: 1 })
    await cleanupAll()
  })

  async function position(): Promise<{ xid: bigint; lsn: string }> {
    const [row] = await sql<{ xid: string; lsn: string }[]>`
      select pg_snapshot_xmax(pg_current_snapshot())::text as xid, pg_current_wal_lsn()::text as lsn`
    return { xid: BigInt(row!.xid), lsn: row!.lsn }
  }

  /** REQUESTS requests, CONCURRENCY at a time; the transaction ids and WAL bytes the database used meanwhile. */
  async function measure(next: (i: number) => { key: string; body: PaymentRequest }): Promise<{ statuses: Record<string, number>; xids: number; wal: number; seconds: number }> {
    const before = await position()
    const started = performance.now()
    const statuses: Record<string, number> = {}
    let i = 0
    await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
      while (i < REQUESTS) {
        const { key, body } = next(i++)
        const a = await post(service.url, key, body)
        const label = a.replayed ? `${a.status} replay` : String(a.status)
        statuses[label] = (statuses[label] ?? 0) + 1
      }
    }))
    const after = await position()
    const [{ wal }] = await sql<{ wal: number }[]>`select pg_wal_lsn_diff(${after.lsn}, ${before.lsn})::float8 as wal` as unknown as [{ wal: number }]
    return { statuses, xids: Number(after.xid - before.xid), wal, seconds: (performance.now() - started) / 1000 }
  }

  test('a fresh payment takes at most two transaction ids; a replay and a 409 take none and write no WAL; one instance holds at most 17 connections', async () => {
    const run = crypto.randomUUID().slice(0, 8)
    const body = (i: number): PaymentRequest => ({ amount: 100 + i, currency: 'EUR', customer: `cus_cap_${run}` })
    await Promise.all(Array.from({ length: 50 }, (_, i) => post(service.url, `cap-warm-${run}-${i}`, body(i))))

    const fresh = await measure((i) => ({ key: `cap-fresh-${run}-${i}`, body: body(i) }))
    const replay = await measure((i) => ({ key: `cap-fresh-${run}-${i}`, body: body(i) }))

    // 64 keys held in processing by a second instance whose provider does not answer.
    const stuck = await startProvider(120_000)
    const holder = await startInstance('capacity-holder', { databaseUrl: db.url, providerUrl: stuck.url, ttlSeconds: 300 })
    const held = Array.from({ length: 64 }, (_, i) => ({ key: `cap-held-${run}-${i}`, body: body(i) }))
    for (const h of held) void post(holder.url, h.key, h.body, 200_000)
    await waitFor('64 keys in processing', async () => {
      const [row] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing' and key like ${`cap-held-${run}-%`}`
      return row!.n === 64
    })
    const conflict = await measure((i) => held[i % held.length]!)
    await holder.kill()
    await stuck.stop()

    const connections = await sql<{ application_name: string; n: number }[]>`
      select application_name, count(*)::int as n from pg_stat_activity
       where datname = ${db.name} and application_name like ${`idempotent-post:${service.pid}%`} group by 1 order by 1`
    const total = connections.reduce((n, c) => n + c.n, 0)
    // Background writes meanwhile: each instance's health probe (2 a second) and heartbeat (two instances in the 409 phase).
    const background = (seconds: number) => Math.ceil(seconds * 5) + 4
    report('capacity properties', {
      'fresh: transaction ids per payment': (fresh.xids / REQUESTS).toFixed(3), 'fresh: WAL bytes per payment': (fresh.wal / REQUESTS).toFixed(0),
      'replay: transaction ids': replay.xids, 'replay: WAL bytes per request': (replay.wal / REQUESTS).toFixed(1),
      '409: transaction ids': conflict.xids, '409: WAL bytes per request': (conflict.wal / REQUESTS).toFixed(1),
      connections: connections.map((c) => `${c.application_name.split(':').pop()}:${c.n}`).join(','),
      statuses: JSON.stringify({ fresh: fresh.statuses, replay: replay.statuses, conflict: conflict.statuses }),
    })
    expect(fresh.statuses).toEqual({ '201': REQUESTS })
    expect(replay.statuses).toEqual({ '201 replay': REQUESTS })
    expect(conflict.statuses).toEqual({ '409': REQUESTS })
    expect(fresh.xids).toBeLessThanOrEqual(2 * REQUESTS + background(fresh.seconds))
    expect(replay.xids).toBeLessThanOrEqual(background(replay.seconds))
    expect(conflict.xids).toBeLessThanOrEqual(background(conflict.seconds))
    // Reads may prune a page (a few bytes of WAL per request, seen up to 22 B on
    // a page full of dead tuples) and the probes add ~120 B each; a row
    // written per request would add 100 B or more per request on top.
    expect(replay.wal / REQUESTS).toBeLessThan(50)
    expect(conflict.wal / REQUESTS).toBeLessThan(50)
    expect(total).toBeLessThanOrEqual(17)
  }, 180_000)
})
