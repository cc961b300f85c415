/**
 * Operators' work on a database distributed by tenant (Citus): the retention
 * purge, expire-stale, force-expire, the gauges, the admin pages and API, and
 * the CLI. Keys are put in their states by SQL (the request path is tested
 * in request-path*.test.ts). Each trap the issue found has its test here:
 * - the purge's FOR UPDATE across shards (refused: "could not run distributed
 *   query with FOR UPDATE/SHARE commands", every minute, never succeeding);
 * - expire-stale's preview, a correlated subquery over a CTE (refused), and its
 *   batch's FOR UPDATE across shards;
 * - the manual purge's audit row with no tenant ("cannot perform an INSERT
 *   with NULL in the partition column").
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { purgeExpired } from '../../src/core/purge'
import { readDuplicates } from '../../src/metrics/read-duplicates'
import { readForcedExpirations } from '../../src/metrics/read-forced-expirations'
import { readProcessingGauges } from '../../src/metrics/read-processing-gauges'
import { readPurgeOverdue } from '../../src/metrics/read-purge-overdue'
import { operations } from '../../src/operations'
import { writeServerSettings } from '../../src/core/settings'
import { startRetentionPurge } from '../../src/maintenance/retention-purge'
import { openPools, type Pools } from '../../src/store/db'
import { isCitus } from '../../src/store/citus'
import { migrateService } from '../../src/store/migrate'
import { api, getPage, signIn, startAdmin, type AdminServer } from '../admin/support'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../support/citus'
import { runIdem } from '../support/cli'

let cluster: CitusCluster
let db: CitusDatabase
let sql: postgres.Sql
let pools: Pools

const TTL = 30
const RETENTION = 3600
const TENANTS = Array.from({ length: 8 }, (_, i) => `tenant-${i}`)

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('operators', { shardCount: 4 })
  await migrateService(db.url)
  sql = postgres(db.url, { max: 4, onnotice: () => undefined })
  pools = openPools(db.url, { applicationName: 'test:citus-operators', shortMax: 4, workMax: 4 })
  await writeServerSettings(sql, { ttlSeconds: TTL, retentionSeconds: RETENTION })
}, 120_000)

afterAll(async () => {
  await pools?.close(1)
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

/** Keys of every tenant: `done` completed `ageSeconds` ago, `stuck` in processing past its deadline, `busy` in processing within it. */
async function seed(prefix: string, options: { done?: number; doneAgeSeconds?: number; stuck?: number; busy?: number }): Promise<void> {
  for (const tenant of TENANTS) {
    const age = options.doneAgeSeconds ?? 2 * RETENTION
    await sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, completed_at, response_status, response_body)
      select ${tenant}, ${prefix} || '-done-' || g, 'POST', '/api/payments', ${'a'.repeat(64)}, 'done',
             now() - make_interval(secs => ${age}), now() - make_interval(secs => ${age}), 201, '{}'
        from generate_series(1, ${options.done ?? 0}) g`
    // Processing keys without a deadline get one and their listing from the trigger of sql/engine/00005, on their shard.
    await sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at)
      select ${tenant}, ${prefix} || '-stuck-' || g, 'POST', '/api/payments', ${'a'.repeat(64)}, 'processing', now() - interval '1 hour', now() - interval '1 hour'
        from generate_series(1, ${options.stuck ?? 0}) g`
    await sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status)
      select ${tenant}, ${prefix} || '-busy-' || g, 'POST', '/api/payments', ${'a'.repeat(64)}, 'processing'
        from generate_series(1, ${options.busy ?? 0}) g`
  }
}

const count = async (where: postgres.PendingQuery<postgres.Row[]>) =>
  (await sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states k where ${where}`)[0]!.n

test('the database is distributed by tenant over both workers', async () => {
  expect(await isCitus(sql)).toBe(true)
  const [nodes] = await sql<{ n: number }[]>`
    select count(distinct p.groupid)::int as n from pg_dist_placement p join pg_dist_shard s using (shardid)
     where s.logicalrelid = 'idempotency_keys'::regclass`
  expect(nodes!.n).toBe(2)
})

describe('the retention purge', () => {
  // Red on the statement of before (one DELETE over every shard, FOR UPDATE SKIP LOCKED): refused with 0A000, every run.
  test('deletes the keys past retention on every shard, in batches, and keeps the rest', async () => {
    await seed('purge', { done: 7, stuck: 1 })
    await seed('recent', { done: 2, doneAgeSeconds: 60 })
    const before = await count(sql`k.key like 'purge-done-%'`)
    expect(before).toBe(56)
    // Batches of 5 across 8 tenants: a batch spans tenants, and the loop runs until one comes back short.
    let total = 0
    for (;;) {
      const deleted = await purgeExpired(sql, { retentionSeconds: RETENTION, batchSize: 5 })
      total += deleted
      if (deleted < 5) break
    }
    expect(total).toBe(56)
    expect(await count(sql`k.key like 'purge-done-%'`)).toBe(0)
    expect(await count(sql`k.key like 'recent-done-%'`)).toBe(16)
    expect(await count(sql`k.key like 'purge-stuck-%' and k.status = 'processing'`)).toBe(8)
  })

  test('the service\'s background purge runs on it too', async () => {
    await seed('background', { done: 3 })
    const purge = startRetentionPurge({ sql, retentionSeconds: RETENTION, intervalMs: 3_600_000 })
    try {
      expect(await purge.runOnce()).toBe(24)
    } finally {
      await purge.stop()
    }
  })
})

describe('operations (the library the admin, its API and the CLI call)', () => {
  const ops = () => operations({ sql, ttlSeconds: TTL, retentionSeconds: RETENTION })

  // Red on the preview of before (its instant in a CTE, a correlated subquery: refused) and on the batch of before (FOR UPDATE across shards).
  test('expire-stale over every tenant: the preview counts them, each is released off the list with its own audit entry', async () => {
    await sql`delete from idempotency_keys where status = 'processing'`
    await seed('expire', { stuck: 3, busy: 1 })
    const preview = await ops().previewExpireStale(undefined)
    expect(preview.stale).toBe(24)
    const result = await ops().expireStale({ asOf: preview.asOf }, 'cli:operator')
    expect(result.expired).toBe(24)
    expect(result.workerAlive).toBe(0)
    expect(await count(sql`k.key like 'expire-stuck-%' and k.status = 'released' and k.release_reason = 'force_expired'`)).toBe(24)
    expect(await count(sql`k.key like 'expire-busy-%' and k.status = 'processing'`)).toBe(8)
    // Off the processing list: only the live ones are left on it (the snapshot of the writable CTEs held, on each shard).
    const [listed] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_processing`
    expect(listed!.n).toBe(8)
    // One entry per key, with its tenant, and the summary, whose tenant (all of them) reads as none.
    const [entries] = await sql<{ n: number; tenants: number }[]>`
      select count(*)::int as n, count(distinct tenant)::int as tenants from idempotency_audit where action = 'force_expire' and outcome = 'expired' and key like 'expire-stuck-%'`
    expect(entries).toEqual({ n: 24, tenants: 8 })
    const summary = await ops().auditEntry(result.auditId)
    expect(summary).toMatchObject({ action: 'expire_all_stale', tenant: null, outcome: 'expired' })
  })

  test('force-expire of one key: released, off the list, audited under its tenant', async () => {
    await seed('single', { stuck: 1 })
    const [{ lease }] = await sql<{ lease: string }[]>`select lease::text from idempotency_key_states where tenant = 'tenant-3' and key = 'single-stuck-1'` as unknown as [{ lease: string }]
    const result = await ops().forceExpire({ tenant: 'tenant-3', key: 'single-stuck-1', lease }, 'cli:operator')
    expect(result.outcome).toBe('expired')
    expect(await count(sql`k.tenant = 'tenant-3' and k.key = 'single-stuck-1' and k.status = 'released'`)).toBe(1)
    const [listed] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_processing where tenant = 'tenant-3' and key = 'single-stuck-1'`
    expect(listed!.n).toBe(0)
    expect(await ops().auditEntry(result.auditId)).toMatchObject({ tenant: 'tenant-3', key: 'single-stuck-1', outcome: 'expired' })
  })

  // Red on the audit entry of before (tenant NULL): Citus refuses a row without its distribution column.
  test('the manual purge records its entry with a tenant (all of them), shown as none', async () => {
    await seed('manual', { done: 2 })
    const result = await ops().purge('cli:operator')
    expect(result.purged).toBe(16)
    const [row] = await sql<{ tenant: string }[]>`select tenant from idempotency_audit where id = ${result.auditId}`
    expect(row!.tenant).toBe('*')
    expect(await ops().auditEntry(result.auditId)).toMatchObject({ action: 'purge_expired', tenant: null, detail: { purged: 16 } })
    expect((await ops().audit({ action: 'purge_expired' })).entries.map((entry) => entry.id)).toContain(result.auditId)
  })

  test('lists, counts, key detail, released keys and the audit trail read across shards', async () => {
    await sql`delete from idempotency_keys where status = 'processing'`
    await seed('read', { stuck: 1, busy: 1, done: 1 })
    const list = await ops().list({ staleOnly: false }, { limit: 100 })
    expect(list.keys.length).toBeGreaterThanOrEqual(16)
    const counts = await ops().count({ staleOnly: false }, { withDone: true })
    expect(counts.stale).toBe(8)
    expect(counts.processing).toBeGreaterThanOrEqual(16)
    expect(await ops().show('tenant-5', 'read-stuck-1')).toMatchObject({ tenant: 'tenant-5', key: 'read-stuck-1', status: 'processing' })
    const released = await ops().listReleased({ reason: 'force_expired' }, { limit: 100 })
    expect(released.keys.length).toBe(25)
    expect((await ops().countReleased()).force_expired).toBe(25)
    expect((await ops().audit({ tenant: 'tenant-3' })).entries.length).toBeGreaterThan(0)
  })
})

test('the gauges read every shard: stale per tenant, the oldest lease, duplicates, forced expirations', async () => {
  await sql`delete from idempotency_keys where status = 'processing'`
  await seed('gauge', { stuck: 2, busy: 1 })
  const gauges = await readProcessingGauges(sql)
  expect([...gauges.staleByTenant.entries()].sort()).toEqual(TENANTS.map((tenant) => [tenant, 2]))
  expect(gauges.oldestAgeSeconds).toBeGreaterThan(3000)
  // Two keys for one request (same path and body) completed in the window: one duplicate.
  await sql`insert into idempotency_keys (tenant, key, method, path, fingerprint, status, completed_at, response_status, response_body)
            values ('tenant-dup', 'dup-a', 'POST', '/api/payments', ${'d'.repeat(64)}, 'done', now(), 201, '{}'),
                   ('tenant-dup', 'dup-b', 'POST', '/api/payments', ${'d'.repeat(64)}, 'done', now(), 201, '{}')`
  expect((await readDuplicates(sql, 3600, TTL, 50_000)).byTenant.get('tenant-dup')).toBe(1)
  // A key completed 30 days ago (the oldest here), on its tenant's shard, past a retention of a minute: the purge's overdue seconds see it.
  await sql`insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_body)
            values ('tenant-old', 'old-a', 'POST', '/api/payments', ${'e'.repeat(64)}, 'done', now() - interval '30 days', now() - interval '30 days', now() - interval '30 days', 201, '{}')`
  expect(await readPurgeOverdue(sql, 60)).toBeGreaterThanOrEqual(30 * 86_400 - 60)
  const forced = await readForcedExpirations(sql, { lo: 0n, hi: 1_000_000n, horizon: 1_000_000n, candidate: 1_000_000n })
  expect(forced.top).toBeGreaterThan(0n)
  expect(forced.rows.find((row) => row.outcome === 'expired')?.n).toBeGreaterThanOrEqual(25)
})

describe('the admin and the CLI', () => {
  let admin: AdminServer
  beforeAll(() => { admin = startAdmin(pools, { ttlSeconds: TTL, retentionSeconds: RETENTION }) })
  afterAll(async () => { await admin?.stop() })

  test('the admin pages and its JSON API answer, and expire-stale and purge act through them', async () => {
    const signed = await signIn(admin.url)
    for (const path of ['/admin', '/admin?stale=1', '/admin/keys/tenant-2/gauge-stuck-1', '/admin/released?reason=force_expired', '/admin/audit', '/admin/confirm/expire-stale', '/admin/confirm/purge']) {
      const { response, html } = await getPage(admin.url, path, signed)
      expect({ path, status: response.status }).toEqual({ path, status: 200 })
      expect(html).not.toContain('Internal')
    }
    const counts = await (await api(admin.url, '/admin/api/counts')).json() as { stale: number }
    expect(counts.stale).toBe(16)
    const expired = await api(admin.url, '/admin/api/keys/expire-stale', { method: 'POST', body: {} })
    expect(expired.status).toBe(200)
    expect(await expired.json()).toMatchObject({ expired: 16 })
    const purged = await api(admin.url, '/admin/api/purge', { method: 'POST' })
    expect(purged.status).toBe(200)
  })

  test('idem list, expire-stale and purge run against the coordinator', async () => {
    await seed('cli', { stuck: 1 })
    const list = await runIdem(db.url, ['list', '--stale', '--json'])
    expect({ code: list.code, stderr: list.stderr }).toEqual({ code: 0, stderr: '' })
    expect((JSON.parse(list.stdout) as { data: unknown[] }).data.length).toBe(8)
    const expire = await runIdem(db.url, ['expire-stale', '--yes', '--json'])
    expect(expire.code).toBe(0)
    expect(JSON.parse(expire.stdout)).toMatchObject({ expired: 8 })
    const purge = await runIdem(db.url, ['purge', '--yes', '--json'])
    expect(purge.code).toBe(0)
  })
})
