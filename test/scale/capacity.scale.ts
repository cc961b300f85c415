/**
 * The figures behind docs/scaling.md's capacity model, measured, not asserted:
 * for fresh payments, replays and 409s, how many requests one CPU second of
 * the service buys, and one CPU second of PostgreSQL; WAL and commits per
 * request; connections per instance; and how fast the retention purge clears
 * a backlog of expired keys.
 *
 * CPU is read from /proc per process group (the service, the PostgreSQL
 * server with all its backends, the provider), so the figures hold on a
 * shared machine: they are per CPU second used, not per second of wall time.
 * The load generator runs in this process and its cost is counted apart.
 *
 * The database is a private PostgreSQL (initdb), so its CPU is ours alone.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import type postgres from 'postgres'
import { meter } from './support/cpu'
import { createDatabase, type OwnDatabase } from './support/database'
import { PostgresServer } from './support/postgres-server'
import { cleanupAll, missing, waitFor } from './support/processes'
import { post, type PaymentRequest } from './support/load'
import { adminClient, report, startInstance, startProvider, TENANT, type Instance, type Provider } from './support/world'

const skip = missing(['initdb', 'postgres'])
if (skip) console.log(`[scale] capacity: ${skip}`)

/** Concurrent client loops: enough to keep one service process busy on this machine. */
const CONCURRENCY = 32
const PHASE_MS = 6_000

interface Phase {
  readonly requests: number
  readonly statuses: Record<string, number>
  readonly wallSeconds: number
  readonly cpu: Record<string, number>
  readonly walBytes: number
  readonly commits: number
}

describe.skipIf(skip !== undefined)('capacity figures (printed, not asserted)', () => {
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

  async function walAndCommits(): Promise<{ lsn: string; commits: number }> {
    const [row] = await sql<{ lsn: string; commits: number }[]>`
      select pg_current_wal_lsn()::text as lsn, xact_commit::float8 as commits from pg_stat_database where datname = ${db.name}`
    return row!
  }

  /** `next()` gives each request its key and body; CONCURRENCY loops run for PHASE_MS. */
  async function phase(name: string, next: (i: number) => { key: string; body: PaymentRequest }): Promise<Phase> {
    const groups = { service: service.pid, postgres: pg.pid!, provider: provider.pid }
    const before = await walAndCommits()
    const cpu = meter(groups)
    const load = process.cpuUsage()
    const statuses: Record<string, number> = {}
    let requests = 0
    const started = performance.now()
    const deadline = started + PHASE_MS
    await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < deadline) {
        const { key, body } = next(requests++)
        const answer = await post(service.url, key, body)
        const label = answer.replayed ? `${answer.status} replay` : String(answer.status)
        statuses[label] = (statuses[label] ?? 0) + 1
      }
    }))
    const wallSeconds = (performance.now() - started) / 1000
    const used: Record<string, number> = { ...cpu.read(), 'load generator': (process.cpuUsage(load).user + process.cpuUsage(load).system) / 1e6 }
    const after = await walAndCommits()
    const [{ bytes }] = await sql<{ bytes: number }[]>`select pg_wal_lsn_diff(${after.lsn}, ${before.lsn})::float8 as bytes` as unknown as [{ bytes: number }]
    const result = { requests, statuses, wallSeconds, cpu: used, walBytes: bytes, commits: after.commits - before.commits }
    report(`capacity ${name}`, {
      requests, 'req/s (wall, 2 shared cores)': (requests / wallSeconds).toFixed(0), statuses: JSON.stringify(statuses),
      'service cpu-s': used.service!.toFixed(2), 'postgres cpu-s': used.postgres!.toFixed(2), 'provider cpu-s': used.provider!.toFixed(2), 'load cpu-s': used['load generator']!.toFixed(2),
      'req per service core-s': (requests / used.service!).toFixed(0), 'req per postgres core-s': (requests / used.postgres!).toFixed(0),
      'WAL bytes/req': (bytes / requests).toFixed(0), 'commits/req': (result.commits / requests).toFixed(2),
    })
    return result
  }

  test('fresh, replay and 409 throughput per core', async () => {
    const run = crypto.randomUUID().slice(0, 8)
    const body = (i: number): PaymentRequest => ({ amount: 100 + (i % 1000), currency: 'EUR', customer: `cus_cap_${run}` })
    // Warm-up: connections open, code paths compiled.
    await Promise.all(Array.from({ length: 200 }, (_, i) => post(service.url, `cap-warm-${run}-${i}`, body(i))))

    const fresh = await phase('fresh', (i) => ({ key: `cap-fresh-${run}-${i}`, body: body(i) }))
    expect(fresh.statuses['201']).toBeGreaterThan(0)
    const done = fresh.statuses['201']!
    const replay = await phase('replay', (i) => {
      const k = i % done
      return { key: `cap-fresh-${run}-${k}`, body: body(k) }
    })
    expect(replay.statuses['201 replay']).toBeGreaterThan(0)

    // Keys held in processing by a second instance whose provider never answers within the phase.
    const stuckProvider = await startProvider(120_000)
    const holder = await startInstance('capacity-holder', { databaseUrl: db.url, providerUrl: stuckProvider.url, ttlSeconds: 300 })
    const held = Array.from({ length: 64 }, (_, i) => ({ key: `cap-held-${run}-${i}`, body: body(i) }))
    for (const h of held) void post(holder.url, h.key, h.body, 200_000)
    await waitFor('64 keys in processing', async () => {
      const [row] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_keys where status = 'processing' and key like ${`cap-held-${run}-%`}`
      return row!.n === 64
    })
    const conflicts = await phase('409', (i) => held[i % held.length]!)
    expect(conflicts.statuses['409']).toBeGreaterThan(0)
    await holder.kill()
    await stuckProvider.stop()

    const connections = await sql<{ application_name: string; n: number }[]>`
      select application_name, count(*)::int as n from pg_stat_activity where datname = ${db.name} and application_name like ${`idempotent-post:%`} group by 1 order by 1`
    report('capacity connections of the measured instance after load', { connections: connections.map((c) => `${c.application_name}:${c.n}`).join(',') })
    const [size] = await sql<{ keys: number; key_bytes: number; payments: number; payment_bytes: number }[]>`
      select (select count(*) from idempotency_keys)::int as keys,
             pg_total_relation_size('idempotency_keys')::float8 as key_bytes,
             (select count(*) from payments)::int as payments,
             pg_total_relation_size('payments')::float8 as payment_bytes`
    report('capacity storage', {
      keys: size!.keys, 'bytes per key (table + indexes)': (size!.key_bytes / size!.keys).toFixed(0),
      payments: size!.payments, 'bytes per payment': (size!.payment_bytes / size!.payments).toFixed(0),
    })
  }, 180_000)

  test('retention purge of a large backlog of expired keys', async () => {
    const rows = 200_000
    // Completed two days ago, past the default one-day retention.
    await sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at,
                                    response_status, response_headers, response_body)
      select ${TENANT}, 'purge-' || g, 'POST', '/api/payments', repeat('a', 64), 'done', now() - interval '2 days', now() - interval '2 days',
             now() - interval '2 days' + g * interval '1 ms', 201, '{}'::jsonb, '{"id":"x"}'
        from generate_series(1, ${rows}) g`
    await sql`vacuum analyze idempotency_keys`
    const cpu = meter({ postgres: pg.pid! })
    const started = performance.now()
    const purger = await startInstance('capacity-purger', { databaseUrl: db.url, providerUrl: provider.url, ttlSeconds: 300, env: { PURGE_INTERVAL_MS: '100' } })
    await waitFor(`${rows} expired keys purged`, async () => {
      const [row] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_keys where key like 'purge-%'`
      return row!.n === 0
    }, 170_000, 250)
    const seconds = (performance.now() - started) / 1000
    const used = cpu.read()
    report('capacity retention purge', {
      rows, seconds: seconds.toFixed(1), 'rows/s': (rows / seconds).toFixed(0), 'postgres cpu-s': used.postgres!.toFixed(2),
      'rows per postgres core-s': (rows / used.postgres!).toFixed(0),
    })
    await purger.kill()
  }, 240_000)
})
