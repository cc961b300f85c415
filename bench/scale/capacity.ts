/**
 * The figures behind docs/explanation/scaling.md's capacity model, measured on one
 * instance and a private PostgreSQL (initdb: its CPU is ours alone):
 *
 * - fresh payments, replays and 409s: requests per CPU second of the service
 *   and of PostgreSQL (CPU read from /proc per process tree, so the figures
 *   hold on a shared machine), WAL bytes and commits per request;
 * - per fresh payment: transaction ids, rows inserted and updated, HOT
 *   updates, dead tuples left for vacuum, table and index bytes (storage per
 *   key and per payment, index churn);
 * - connections one instance opens;
 * - the health probe's own cost (an idle instance: transaction ids and WAL per second);
 * - the retention purge of a 200,000-key backlog.
 */
import type postgres from 'postgres'
import { meter } from '../../test/scale/support/cpu'
import { createDatabase, type OwnDatabase } from '../../test/scale/support/database'
import { post, type PaymentRequest } from '../../test/scale/support/load'
import { PostgresServer } from '../../test/scale/support/postgres-server'
import { cleanupAll, waitFor } from '../../test/scale/support/processes'
import { adminClient, startInstance, startProvider, TENANT, type Instance, type Provider } from '../../test/scale/support/world'
import type { Section } from './report'

/** Concurrent client loops: enough to keep one service process busy on this machine. */
const CONCURRENCY = 32
const PHASE_MS = 6_000
const PURGE_BACKLOG = 200_000

interface Counters {
  lsn: string
  commits: number
  xid: string
  keys: TableStats
  payments: TableStats
  /** The list of keys in processing (sql/00006), when the schema has it. */
  processing: TableStats
}

type Table = 'keys' | 'payments' | 'processing'
const TABLES: Record<Table, string> = { keys: 'idempotency_keys', payments: 'payments', processing: 'idempotency_processing' }

interface TableStats { ins: number; upd: number; del: number; hot: number; dead: number; table: number; indexes: number }

export async function capacity(): Promise<Section> {
  const pg = PostgresServer.init('bench-capacity-pg')
  await pg.start()
  const db: OwnDatabase = await createDatabase('bench_capacity', pg.url())
  const sql = adminClient(db.url)
  const provider: Provider = await startProvider(0)
  const service: Instance = await startInstance('bench-capacity', { databaseUrl: db.url, providerUrl: provider.url, ttlSeconds: 300 })
  const rows: string[][] = []
  try {
    const run = crypto.randomUUID().slice(0, 8)
    const body = (i: number): PaymentRequest => ({ amount: 100 + (i % 1000), currency: 'EUR', customer: `cus_cap_${run}` })
    await Promise.all(Array.from({ length: 200 }, (_, i) => post(service.url, `cap-warm-${run}-${i}`, body(i))))

    const fresh = await phase(sql, db, pg, service, provider, (i) => ({ key: `cap-fresh-${run}-${i}`, body: body(i) }))
    const created = fresh.statuses['201'] ?? 0
    rows.push(row('fresh payment (201)', fresh, created))
    const d = (name: keyof TableStats, table: Table) => (fresh.after[table][name] - fresh.before[table][name]) / created
    rows.push(['per fresh payment: transaction ids', (Number(BigInt(fresh.after.xid) - BigInt(fresh.before.xid)) / created).toFixed(2), 'the next transaction id (pg_current_snapshot) before and after'])
    rows.push(['per fresh payment: idempotency_keys rows inserted / updated / HOT-updated', `${d('ins', 'keys').toFixed(2)} / ${d('upd', 'keys').toFixed(2)} / ${d('hot', 'keys').toFixed(2)}`, 'pg_stat_user_tables'])
    rows.push(['per fresh payment: idempotency_processing rows inserted (each deleted at completion)', d('ins', 'processing').toFixed(2), 'pg_stat_user_tables'])
    rows.push(['per fresh payment: row versions made dead (updates + deletes: keys, payments, processing list)', `${(d('upd', 'keys') + d('del', 'keys')).toFixed(2)}, ${(d('upd', 'payments') + d('del', 'payments')).toFixed(2)}, ${(d('upd', 'processing') + d('del', 'processing')).toFixed(2)}`, 'pg_stat_user_tables; a HOT one is pruned in place, the others wait for vacuum'])
    rows.push(['per fresh payment: bytes of idempotency_keys table / its indexes', `${d('table', 'keys').toFixed(0)} / ${d('indexes', 'keys').toFixed(0)}`, 'pg_relation_size, pg_indexes_size'])
    rows.push(['per fresh payment: bytes of payments table / its indexes', `${d('table', 'payments').toFixed(0)} / ${d('indexes', 'payments').toFixed(0)}`, 'pg_relation_size, pg_indexes_size'])

    const replay = await phase(sql, db, pg, service, provider, (i) => { const k = i % created; return { key: `cap-fresh-${run}-${k}`, body: body(k) } })
    rows.push(row('replay (201 + Idempotent-Replayed)', replay, replay.statuses['201 replay'] ?? 0))

    // Keys held in processing by a second instance whose provider does not answer within the phase.
    const stuck = await startProvider(120_000)
    const holder = await startInstance('bench-capacity-holder', { databaseUrl: db.url, providerUrl: stuck.url, ttlSeconds: 300 })
    const held = Array.from({ length: 64 }, (_, i) => ({ key: `cap-held-${run}-${i}`, body: body(i) }))
    for (const h of held) void post(holder.url, h.key, h.body, 200_000)
    await waitFor('64 keys in processing', async () => {
      const [r] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_keys where status = 'processing' and key like ${`cap-held-${run}-%`}`
      return r!.n === 64
    })
    const conflicts = await phase(sql, db, pg, service, provider, (i) => held[i % held.length]!)
    rows.push(row('in progress (409)', conflicts, conflicts.statuses['409'] ?? 0))
    await holder.kill()
    await stuck.stop()

    const connections = await sql<{ application_name: string; n: number }[]>`
      select application_name, count(*)::int as n from pg_stat_activity where datname = ${db.name} and application_name like ${`idempotent-post:${service.pid}%`} group by 1 order by 1`
    rows.push(['connections of one instance after load', connections.map((c) => `${c.application_name.split(':').pop()}: ${c.n}`).join(', '), 'pg_stat_activity by application_name'])
    const [size] = await sql<{ keys: number; key_bytes: number; payments: number; payment_bytes: number }[]>`
      select (select count(*) from idempotency_keys)::int as keys, pg_total_relation_size('idempotency_keys')::float8 as key_bytes,
             (select count(*) from payments)::int as payments, pg_total_relation_size('payments')::float8 as payment_bytes`
    rows.push(['storage per key (table, indexes, TOAST; stored answer included)', `${(size!.key_bytes / size!.keys).toFixed(0)} B over ${size!.keys} keys`, 'pg_total_relation_size / count'])
    rows.push(['storage per payment', `${(size!.payment_bytes / size!.payments).toFixed(0)} B over ${size!.payments} payments`, 'pg_total_relation_size / count'])

    // The health probe alone: an idle instance for 10 s.
    const idleBefore = await counters(sql, db)
    const idleStart = performance.now()
    await Bun.sleep(10_000) // the measured interval itself
    const idleAfter = await counters(sql, db)
    const idleSeconds = (performance.now() - idleStart) / 1000
    const [{ bytes }] = await sql<{ bytes: number }[]>`select pg_wal_lsn_diff(${idleAfter.lsn}, ${idleBefore.lsn})::float8 as bytes` as unknown as [{ bytes: number }]
    rows.push(['idle instance (health probe 2/s, heartbeat): transaction ids / WAL per second', `${(Number(BigInt(idleAfter.xid) - BigInt(idleBefore.xid)) / idleSeconds).toFixed(2)} / ${(bytes / idleSeconds).toFixed(0)} B`, '10 s with no traffic'])

    // The retention purge of a backlog, completed two days ago.
    await sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at,
                                    response_status, response_headers, response_body)
      select ${TENANT}, 'purge-' || g, 'POST', '/api/payments', repeat('a', 64), 'done', now() - interval '2 days', now() - interval '2 days',
             now() - interval '2 days' + g * interval '1 ms', 201, '{}'::jsonb, '{"id":"x"}'
        from generate_series(1, ${PURGE_BACKLOG}) g`
    await sql`vacuum analyze idempotency_keys`
    const cpu = meter({ postgres: pg.pid! })
    const started = performance.now()
    const purger = await startInstance('bench-capacity-purger', { databaseUrl: db.url, providerUrl: provider.url, ttlSeconds: 300, env: { PURGE_INTERVAL_MS: '100' } })
    await waitFor(`${PURGE_BACKLOG} expired keys purged`, async () => {
      const [r] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_keys where key like 'purge-%'`
      return r!.n === 0
    }, 170_000, 250)
    const seconds = (performance.now() - started) / 1000
    const used = cpu.read().postgres!
    rows.push(['retention purge of a 200,000-key backlog', `${seconds.toFixed(1)} s, ${(PURGE_BACKLOG / seconds).toFixed(0)} rows/s, ${(PURGE_BACKLOG / used).toFixed(0)} rows per PostgreSQL core-second`, 'one instance, PURGE_INTERVAL_MS=100'])
    await purger.kill()
  } finally {
    await sql.end({ timeout: 1 })
    await cleanupAll()
  }
  return { title: 'Capacity (one instance, a private PostgreSQL, provider delay 0)', columns: ['figure', 'value', 'how'], rows }
}

interface Phase {
  readonly requests: number
  readonly statuses: Record<string, number>
  readonly cpu: Record<string, number>
  readonly walBytes: number
  readonly before: Counters
  readonly after: Counters
}

function row(kind: string, p: Phase, counted: number): [string, string, string] {
  const per = (n: number) => (n / p.requests)
  return [
    kind,
    `${(counted / p.cpu.service!).toFixed(0)} per service core-s, ${(counted / p.cpu.postgres!).toFixed(0)} per PostgreSQL core-s; ` +
      `${per(p.walBytes).toFixed(0)} B of WAL and ${per(p.after.commits - p.before.commits).toFixed(2)} commits per request`,
    `${CONCURRENCY} clients, ${PHASE_MS / 1000} s; ${JSON.stringify(p.statuses)}`,
  ]
}

async function counters(sql: postgres.Sql, db: OwnDatabase): Promise<Counters> {
  const [row] = await sql<{ lsn: string; commits: number; xid: string }[]>`
    select pg_current_wal_lsn()::text as lsn, xact_commit::float8 as commits, pg_snapshot_xmax(pg_current_snapshot())::text as xid
      from pg_stat_database where datname = ${db.name}`
  const stats = await sql<{ relname: string; ins: number; upd: number; del: number; hot: number; dead: number; table: number; indexes: number }[]>`
    select relname, n_tup_ins::float8 as ins, n_tup_upd::float8 as upd, n_tup_del::float8 as del, n_tup_hot_upd::float8 as hot, n_dead_tup::float8 as dead,
           pg_relation_size(relid)::float8 as table, pg_indexes_size(relid)::float8 as indexes
      from pg_stat_user_tables where relname in ('idempotency_keys', 'payments', 'idempotency_processing')`
  // The statistics collector is asynchronous: pg_stat_clear_snapshot() takes a fresh view next time.
  await sql`select pg_stat_clear_snapshot()`
  const of = (name: string): TableStats => {
    const r = stats.find((s) => s.relname === name)
    return r ? { ins: r.ins, upd: r.upd, del: r.del, hot: r.hot, dead: r.dead, table: r.table, indexes: r.indexes } : { ins: 0, upd: 0, del: 0, hot: 0, dead: 0, table: 0, indexes: 0 }
  }
  return { lsn: row!.lsn, commits: row!.commits, xid: row!.xid, keys: of(TABLES.keys), payments: of(TABLES.payments), processing: of(TABLES.processing) }
}

/**
 * The counters once the table statistics stopped moving: backends report
 * them asynchronously (at most once a second, and up to 10 s after their last
 * transaction when idle), so a reading right after a phase misses some.
 */
async function settled(sql: postgres.Sql, db: OwnDatabase): Promise<Counters> {
  let last = await counters(sql, db)
  for (const deadline = Date.now() + 15_000; Date.now() < deadline;) {
    await Bun.sleep(1_000)
    const now = await counters(sql, db)
    const same = (t: Table) => now[t].ins === last[t].ins && now[t].upd === last[t].upd
    if (same('keys') && same('payments') && same('processing')) return { ...now, lsn: last.lsn, xid: last.xid, commits: last.commits }
    last = now
  }
  return last
}

async function phase(sql: postgres.Sql, db: OwnDatabase, pg: PostgresServer, service: Instance, provider: Provider, next: (i: number) => { key: string; body: PaymentRequest }): Promise<Phase> {
  const before = await settled(sql, db)
  const cpu = meter({ service: service.pid, postgres: pg.pid!, provider: provider.pid })
  const statuses: Record<string, number> = {}
  let requests = 0
  const deadline = performance.now() + PHASE_MS
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (performance.now() < deadline) {
      const { key, body } = next(requests++)
      const answer = await post(service.url, key, body)
      const label = answer.replayed ? `${answer.status} replay` : String(answer.status)
      statuses[label] = (statuses[label] ?? 0) + 1
    }
  }))
  const used = cpu.read()
  const after = await settled(sql, db)
  const [{ bytes }] = await sql<{ bytes: number }[]>`select pg_wal_lsn_diff(${after.lsn}, ${before.lsn})::float8 as bytes` as unknown as [{ bytes: number }]
  return { requests, statuses, cpu: used, walBytes: bytes, before, after }
}
