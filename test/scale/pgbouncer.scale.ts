/**
 * The service through PgBouncer (Debian's 1.18) in transaction mode, in front
 * of the machine's PostgreSQL, with DATABASE_PGBOUNCER=1.
 *
 * 1.18 keeps no prepared statement across transactions and refuses startup
 * parameters it does not know (statement_timeout & co.), so the service sends
 * neither, and the session settings come from `ALTER ROLE ... IN DATABASE ...
 * SET` (docs/how-to/pgbouncer.md). The first test proves those settings really reach
 * the sessions PgBouncer hands out: a statement is cancelled at 5 s.
 *
 * The pool is oversubscribed on purpose: POOL_SIZE server connections for
 * the 17 client connections of an instance (pools and health probe). One
 * instance batches its claims and completions (at most two statements in
 * flight per pool), so it rarely has more than POOL_SIZE transactions at
 * once; the many-keys storm therefore runs through three instances, and
 * clients queue in PgBouncer, as in any deployment that needs a pooler.
 * Then the same-key storm, the many-keys storm, and SIGKILLs of the service
 * under load, each ending with payments counted in the database and charges
 * at the provider; a pool held for good answered 503 within
 * query_wait_timeout (seconds) instead of PgBouncer's two minutes; a lease
 * lost in the middle of the completion's pipeline (the pattern of pgbouncer
 * issue 759: an error inside pipelined statements); and `npm run migrate`
 * refusing the PgBouncer URL.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { LeaseLostError } from '../../src/core/errors'
import { missingSessionSettings, sessionSettingsSql, STATEMENT_TIMEOUT_MS } from '../../src/store/db'
import { createDatabase, type OwnDatabase } from './support/database'
import { PgBouncer } from './support/pgbouncer'
import { cleanupAll, missing, waitFor } from './support/processes'
import { waitUntil } from '../support/wait'
import { ms, oddAnswers, paidId, percentile, post, storm, tally, untilPaid, type Answer } from './support/load'
import { adminClient, checkLedgers, providerWired, report, startInstance, startProvider, TENANT, type Instance, type Provider } from './support/world'

const skip = missing(['pgbouncer'])
if (skip) console.log(`[scale] pgbouncer: ${skip}`)

/** Long enough that the whole storm lands while the first request is still at the provider. */
const SLOW_PROVIDER_MS = 800
const CHAOS_PROVIDER_MS = 150
const TTL_SECONDS = 3
/** Server connections in the pool: fewer than one instance's 17 client connections. */
const POOL_SIZE = 4

describe.skipIf(skip !== undefined)('through PgBouncer in transaction mode', () => {
  let db: OwnDatabase
  let bouncer: PgBouncer
  let slowProvider: Provider
  let fastProvider: Provider
  let service: Instance
  let sql: postgres.Sql
  const wired = providerWired()

  beforeAll(async () => {
    db = await createDatabase('pgb')
    sql = adminClient(db.url)
    // The operator's one-time step (docs/how-to/pgbouncer.md), for the role the service logs in as.
    await sql.unsafe(sessionSettingsSql(db.user, db.name))
    bouncer = await PgBouncer.start({ host: db.host, port: db.port, database: db.name, poolSize: POOL_SIZE })
    ;[slowProvider, fastProvider] = await Promise.all([startProvider(SLOW_PROVIDER_MS), startProvider(CHAOS_PROVIDER_MS)])
    service = await startInstance('pgb', { databaseUrl: bouncer.url(), providerUrl: slowProvider.url, pgbouncer: true, ttlSeconds: TTL_SECONDS })
  }, 120_000)

  afterAll(async () => {
    await sql?.end({ timeout: 1 })
    await cleanupAll()
    await db?.drop()
  })

  test('the session settings reach the sessions PgBouncer hands out; startup parameters would not', async () => {
    // What the service would send without DATABASE_PGBOUNCER=1: refused by PgBouncer.
    const naive = postgres(bouncer.url(), { max: 1, prepare: false, connect_timeout: 2, connection: { statement_timeout: STATEMENT_TIMEOUT_MS } as Record<string, unknown> as never, onnotice: () => undefined })
    const refused = await naive`select 1`.then(() => 'accepted', (error: Error) => error.message)
    await naive.end({ timeout: 0 })
    console.log(`[scale] pgbouncer: statement_timeout as a startup parameter: ${refused}`)
    expect(refused).toMatch(/unsupported startup parameter/i)

    const through = postgres(bouncer.url(), { max: 2, prepare: false, onnotice: () => undefined })
    try {
      expect(await missingSessionSettings(through)).toEqual([])
      // Observed, not just shown: a statement past statement_timeout is cancelled (57014).
      const started = performance.now()
      const code = await through`select pg_sleep(${(STATEMENT_TIMEOUT_MS + 3_000) / 1000})`.then(() => 'finished', (error: { code?: string }) => error.code)
      const elapsed = performance.now() - started
      console.log(`[scale] pgbouncer: pg_sleep(${(STATEMENT_TIMEOUT_MS + 3_000) / 1000}) through PgBouncer ended with ${code} after ${ms(elapsed)}`)
      expect(code).toBe('57014')
      expect(elapsed).toBeLessThan(STATEMENT_TIMEOUT_MS + 3_000)
    } finally {
      await through.end({ timeout: 1 })
    }
    // The service checked them at start and found them in force (it says so loudly when not).
    await Bun.sleep(200)
    expect(service.output()).not.toContain('not in force')
    expect(service.output()).not.toContain('could not check the session settings')
    // The start-up migration's session advisory lock, taken through PgBouncer:
    // printed, for docs/how-to/pgbouncer.md's advice to migrate directly.
    const [{ locks }] = await sql<{ locks: number }[]>`
      select count(*)::int as locks from pg_locks l join pg_database d on d.oid = l.database
       where l.locktype = 'advisory' and d.datname = ${db.name}` as unknown as [{ locks: number }]
    console.log(`[scale] pgbouncer: session advisory locks held on pooled server connections after the service's start-up migration: ${locks}`)
  }, 60_000)

  test('a service without the role settings says so at start', async () => {
    const other = await createDatabase('pgb_bare')
    const bare = await PgBouncer.start({ host: other.host, port: other.port, database: other.name })
    try {
      const instance = await startInstance('pgb-bare', { databaseUrl: bare.url(), providerUrl: slowProvider.url, pgbouncer: true })
      // The log is JSON lines: the warning's text is the line's msg.
      const warning = () => instance.output().split('\n').flatMap((line) => {
        try {
          const msg = (JSON.parse(line) as { msg?: unknown }).msg
          return typeof msg === 'string' && msg.includes('not in force') ? [msg] : []
        } catch {
          return []
        }
      })[0]
      await waitUntil(() => warning() !== undefined, 10_000, 50)
      expect(warning()).toContain('statement_timeout = 0 (want 5000)')
      expect(warning()).toContain(`alter role "${other.user}" in database "${other.name}" set statement_timeout = 5000;`)
      await instance.kill()
    } finally {
      await bare.stop()
      await other.drop()
    }
  }, 60_000)

  test('storm: 300 concurrent requests with one key, one payment', async () => {
    const key = `pgb-storm-${crypto.randomUUID()}`
    const customer = `cus_pgb_storm_${crypto.randomUUID().slice(0, 8)}`
    const answers = await storm(service.url, key, 300, { amount: 1250, currency: 'EUR', customer })
    const counts = tally(answers)
    const created = answers.filter((a) => a.status === 201 && !a.replayed)
    const conflicts = answers.filter((a) => a.status === 409)
    const ledger = await checkLedgers(sql, slowProvider, new Map([[key, { customer, ...(created[0]?.id ? { answeredId: created[0].id } : {}) }]]))
    report('pgbouncer storm 300x1', {
      answers: JSON.stringify(counts), payments: ledger.payments, charges: ledger.charges, lost: ledger.lost,
      duplicated: ledger.duplicatedPayments + ledger.duplicatedCharges,
      '409 p50': ms(percentile(conflicts.map((a) => a.ms), 50)), '409 p99': ms(percentile(conflicts.map((a) => a.ms), 99)),
    })
    expect(created).toHaveLength(1)
    expect(answers.every((a) => a.status === 409 || (a.status === 201 && a.id === created[0]!.id))).toBe(true)
    expect(ledger.payments).toBe(1)
    if (wired) expect(ledger.charges).toBe(1)
  }, 120_000)

  /** This database's pool in PgBouncer's SHOW POOLS / SHOW STATS. */
  async function pool(): Promise<{ waiting: number; servers: number; waitMicros: number }> {
    const [pools, stats] = await Promise.all([bouncer.show('POOLS'), bouncer.show('STATS')])
    const mine = pools.filter((p) => p.database === db.name)
    return {
      waiting: mine.reduce((n, p) => n + Number(p.cl_waiting), 0),
      servers: mine.reduce((n, p) => n + Number(p.sv_active) + Number(p.sv_idle) + Number(p.sv_used) + Number(p.sv_tested) + Number(p.sv_login), 0),
      waitMicros: Number(stats.find((row) => row.database === db.name)?.total_wait_time ?? 0),
    }
  }

  test('storm: 200 keys x 10 concurrent requests from three instances through an oversubscribed pool, 200 payments', async () => {
    const others = await Promise.all(['pgb-2', 'pgb-3'].map((name) =>
      startInstance(name, { databaseUrl: bouncer.url(), providerUrl: slowProvider.url, pgbouncer: true, ttlSeconds: TTL_SECONDS })))
    const run = crypto.randomUUID().slice(0, 8)
    const keys = Array.from({ length: 200 }, (_, i) => ({ key: `pgb-many-${run}-${i}`, customer: `cus_pgb_many_${run}_${i}`, amount: 100 + i }))
    const waitedBefore = (await pool()).waitMicros
    let maxWaiting = 0
    let maxServers = 0
    let storming = true
    const sampler = (async () => {
      while (storming) {
        const now = await pool()
        maxWaiting = Math.max(maxWaiting, now.waiting)
        maxServers = Math.max(maxServers, now.servers)
        await Bun.sleep(20)
      }
    })()
    // Each key's 10 requests spread over the three instances (4 + 3 + 3), all at once.
    const urls = [service.url, ...others.map((o) => o.url)]
    const answers = await Promise.all(keys.map(async ({ key, customer, amount }) => ({
      key,
      answers: (await Promise.all(urls.map((url, i) => storm(url, key, i === 0 ? 4 : 3, { amount, currency: 'EUR', customer })))).flat(),
    })))
    storming = false
    await sampler
    await Promise.all(others.map((o) => o.stop()))
    const waited = (await pool()).waitMicros - waitedBefore
    const all = answers.flatMap((a) => a.answers)
    const expected = new Map(keys.map(({ key, customer }) => {
      const ids = new Set(answers.find((a) => a.key === key)!.answers.flatMap((a) => (a.id ? [a.id] : [])))
      expect(ids.size).toBe(1)
      return [key, { customer, answeredId: [...ids][0]! }]
    }))
    const ledger = await checkLedgers(sql, slowProvider, expected)
    report('pgbouncer storm 200x10', {
      answers: JSON.stringify(tally(all)), payments: ledger.payments, charges: ledger.charges, lost: ledger.lost,
      duplicated: ledger.duplicatedPayments + ledger.duplicatedCharges,
      'server connections (most seen)': maxServers, 'clients waiting for one (most seen)': maxWaiting, 'client wait, total': ms(waited / 1000),
    })
    // Oversubscribed for real: clients queued for the POOL_SIZE server connections.
    expect(maxServers).toBeLessThanOrEqual(POOL_SIZE)
    expect(waited).toBeGreaterThan(0)
    expect(all.filter((a) => a.status !== 201 && a.status !== 409)).toEqual([])
    expect(ledger).toMatchObject({ payments: 200, lost: 0, missing: 0, duplicatedPayments: 0 })
    if (wired) expect(ledger).toMatchObject({ charges: 200, duplicatedCharges: 0, unmatchedReferences: 0 })
  }, 180_000)

  test('SIGKILL the service 4 times under load, restart it: exactly one payment and one charge per key', async () => {
    await service.stop()
    const start = () => startInstance('pgb-chaos', { databaseUrl: bouncer.url(), providerUrl: fastProvider.url, pgbouncer: true, ttlSeconds: TTL_SECONDS })
    let current = await start()
    const run = crypto.randomUUID().slice(0, 8)
    const keys = Array.from({ length: 60 }, (_, i) => ({ key: `pgb-chaos-${run}-${i}`, customer: `cus_pgb_chaos_${run}_${i}`, amount: 200 + i }))
    const results = new Map<string, Answer[]>()
    let stranded = 0
    const clients = keys.map(async ({ key, customer, amount }, i) => {
      await Bun.sleep(i * 40)
      results.set(key, await untilPaid(() => current.url, key, { amount, currency: 'EUR', customer }, { deadlineMs: 120_000 }))
    })
    const chaos = (async () => {
      for (let kill = 0; kill < 4; kill++) {
        await Bun.sleep(400 + Math.random() * 300)
        await waitUntil(async () => (await sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing'`)[0]!.n > 0, 5_000)
        await current.kill()
        const [row] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing'`
        stranded += row!.n
        await Bun.sleep(100)
        current = await start()
      }
    })()
    await Promise.all([...clients, chaos])
    const expected = new Map(keys.map(({ key, customer }) => [key, { customer, answeredId: paidId(results.get(key)!)! }]))
    for (const [key, answers] of results) {
      const ids = new Set(answers.flatMap((a) => (a.id ? [a.id] : [])))
      expect([key, ids.size]).toEqual([key, 1])
    }
    const ledger = await checkLedgers(sql, fastProvider, expected)
    const [{ processing }] = await sql<{ processing: number }[]>`select count(*)::int as processing from idempotency_key_states where tenant = ${TENANT} and status = 'processing'` as unknown as [{ processing: number }]
    const pools = await bouncer.show('POOLS')
    report('pgbouncer kill/restart', {
      kills: 4, stranded, answers: JSON.stringify(tally([...results.values()].flat())), payments: ledger.payments, charges: ledger.charges,
      lost: ledger.lost, duplicated: ledger.duplicatedPayments + ledger.duplicatedCharges, processing,
      'server conns': pools.filter((p) => p.database === db.name).map((p) => `active=${p.sv_active} idle=${p.sv_idle}`).join(';'),
    })
    expect(stranded).toBeGreaterThan(0)
    expect(ledger).toMatchObject({ payments: keys.length, lost: 0, missing: 0, duplicatedPayments: 0 })
    if (wired) expect(ledger).toMatchObject({ charges: keys.length, duplicatedCharges: 0, unmatchedReferences: 0 })
    expect(processing).toBe(0)
    expect(await current.stop()).toBe(0)
  }, 240_000)

  test('a pool held for good: requests are answered 503 within query_wait_timeout (seconds), not after PgBouncer\'s two minutes', async () => {
    const QUERY_WAIT_TIMEOUT_S = 3
    const held = await PgBouncer.start({ host: db.host, port: db.port, database: db.name, poolSize: 2, settings: { query_wait_timeout: QUERY_WAIT_TIMEOUT_S } })
    const instance = await startInstance('pgb-held', { databaseUrl: held.url(), providerUrl: fastProvider.url, pgbouncer: true, ttlSeconds: TTL_SECONDS })
    const run = crypto.randomUUID().slice(0, 8)
    const body = (i: number) => ({ amount: 900 + i, currency: 'EUR', customer: `cus_pgb_held_${run}_${i}` })
    expect((await post(instance.url, `pgb-held-${run}-warm`, body(99))).status).toBe(201)
    // Both server connections taken by long transactions (a runaway report, a stuck migration).
    const holders = Array.from({ length: 2 }, () => postgres(held.url(), { max: 1, prepare: false, onnotice: () => undefined }))
    const holding = holders.map((h) => h.begin(async (tx) => {
      await tx`set local statement_timeout = 0`
      await tx`select pg_sleep(60)`
    }).catch(() => 'ended'))
    await waitFor('both server connections held', async () => {
      const [row] = await sql<{ n: number }[]>`select count(*)::int as n from pg_stat_activity where datname = ${db.name} and query like 'select pg_sleep(%'`
      return row!.n === 2
    })
    const heldAt = performance.now()
    const answers: Answer[] = []
    let notReadyAfter: number | undefined
    try {
      for (let i = 0; i < 10; i++) {
        answers.push(await post(instance.url, `pgb-held-${run}-${i}`, body(i), 150_000))
        if (notReadyAfter === undefined && (await fetch(`${instance.url}/readyz`)).status === 503) notReadyAfter = performance.now() - heldAt
      }
    } finally {
      await sql`select pg_cancel_backend(pid) from pg_stat_activity where datname = ${db.name} and query like 'select pg_sleep(%'`
      await Promise.all(holding)
      await Promise.all(holders.map((h) => h.end({ timeout: 1 })))
    }
    report('pgbouncer pool held, query_wait_timeout', {
      'query_wait_timeout': `${QUERY_WAIT_TIMEOUT_S}s`, answers: JSON.stringify(tally(answers)),
      'slowest answer': ms(Math.max(...answers.map((a) => a.ms))), '/readyz 503 after': notReadyAfter === undefined ? 'never' : ms(notReadyAfter),
      odd: JSON.stringify(oddAnswers(answers)),
    })
    // The process survived PgBouncer's error (invariant 9): it still answers.
    expect([(await fetch(`${instance.url}/healthz`).catch(() => undefined))?.status, instance.output().slice(-2_000)]).toEqual([200, expect.any(String)])
    for (const a of answers) {
      expect(a.status).toBe(503)
      expect(a.detail ?? '').toContain('"status":503')
      expect(a.ms).toBeLessThan(QUERY_WAIT_TIMEOUT_S * 1000 + 2_500)
    }
    expect(notReadyAfter).toBeDefined()
    // The pool is free again: the same keys are paid once each.
    const expected = new Map<string, { customer: string; answeredId?: string }>()
    for (let i = 0; i < 10; i++) {
      const tries = await untilPaid(() => instance.url, `pgb-held-${run}-${i}`, body(i), { deadlineMs: 60_000 })
      expected.set(`pgb-held-${run}-${i}`, { customer: body(i).customer, answeredId: paidId(tries)! })
    }
    const ledger = await checkLedgers(sql, fastProvider, expected)
    expect(ledger).toMatchObject({ payments: 10, charges: 10, lost: 0, duplicatedPayments: 0, duplicatedCharges: 0 })
    await instance.kill()
    await held.stop()
  }, 120_000)

  test('a lease lost while the completion waits inside its statement: 409, its payment not written, the one server connection clean for the next client', async () => {
    // One server connection: the fence's error and the pipelined COMMIT travel
    // it, and the next client's transaction is served on the very same one.
    const one = await PgBouncer.start({ host: db.host, port: db.port, database: db.name, poolSize: 1 })
    const instance = await startInstance('pgb-759', { databaseUrl: one.url(), providerUrl: fastProvider.url, pgbouncer: true, ttlSeconds: TTL_SECONDS })
    const run = crypto.randomUUID().slice(0, 8)
    const body = (i: number, kind: string) => ({ amount: 300 + i, currency: 'EUR', customer: `cus_pgb_759_${kind}_${run}_${i}` })
    const serverConnection = async () => {
      const servers = (await one.show('SERVERS')).filter((row) => row.database === db.name)
      return servers.map((row) => `${row.remote_pid}@${row.connect_time}`).join(',')
    }
    expect((await post(instance.url, `pgb-759-${run}-warm`, body(0, 'warm'))).status).toBe(201)
    const connection = await serverConnection()
    const ROUNDS = 5
    const lost: { key: string; customer: string; amount: number }[] = []
    const direct = await sql.reserve()
    try {
      for (let i = 0; i < ROUNDS; i++) {
        const key = `pgb-759-${run}-${i}`
        // The barrier: the worker's completion (the payment INSERT with the key's fence) waits on this lock.
        await direct`begin`
        await direct`lock table payments in share mode`
        const answer = post(instance.url, key, body(i, 'lost'))
        await waitFor(`${key}'s completion waiting on the barrier`, async () => {
          const [row] = await sql<{ n: number }[]>`
            select count(*)::int as n from pg_stat_activity
             where datname = ${db.name} and wait_event_type = 'Lock' and query ilike '%payments%'`
          return row!.n === 1
        }, 30_000, 5)
        // Now the claim is taken over (a reclaim, a force-expire): the completion's fence must miss it.
        const [taken] = await direct<{ n: number }[]>`
          with t as (update idempotency_keys set lease = case when lease < 9223372036854775807 then lease + 1 else lease - 1 end, locked_at = now()
                      where tenant = ${TENANT} and key = ${key} and status = 'processing' returning 1)
          select count(*)::int as n from t`
        expect(taken!.n).toBe(1)
        await direct`commit`
        const a = await answer
        expect([key, a.status]).toEqual([key, 409])
        expect(a.detail ?? '').toContain('lease-lost')
        lost.push({ key, customer: body(i, 'lost').customer, amount: body(i, 'lost').amount })
        // The next client, on the same server connection: served, and its transaction is its own.
        const next = await post(instance.url, `pgb-759-${run}-next-${i}`, body(i, 'next'))
        expect(next.status).toBe(201)
      }
    } finally {
      await direct`rollback`.catch(() => undefined)
      direct.release()
    }
    const [{ payments }] = await sql<{ payments: number }[]>`
      select count(*)::int as payments from payments where idempotency_key in ${sql(lost.map((l) => l.key))}` as unknown as [{ payments: number }]
    const [{ aborted }] = await sql<{ aborted: number }[]>`
      select count(*)::int as aborted from pg_stat_activity where datname = ${db.name} and state like 'idle in transaction%'` as unknown as [{ aborted: number }]
    const after = await serverConnection()
    report('pgbouncer lease lost while the completion waits', {
      rounds: ROUNDS, 'payments of the lost leases': payments, 'sessions left in a transaction': aborted,
      'server connection': connection === after ? 'the same one throughout' : `${connection} -> ${after}`,
    })
    expect(payments).toBe(0) // fenced: not written
    expect(aborted).toBe(0)
    expect(after).toBe(connection) // PgBouncer kept it: it came back clean, never closed as unclean
    // Their retries, once the taken-over claim is stale, are paid once and charged once (same request, same downstream key).
    const expected = new Map<string, { customer: string; answeredId?: string }>()
    for (const l of lost) {
      const tries = await untilPaid(() => instance.url, l.key, { amount: l.amount, currency: 'EUR', customer: l.customer }, { deadlineMs: 60_000 })
      expected.set(l.key, { customer: l.customer, answeredId: paidId(tries)! })
    }
    const ledger = await checkLedgers(sql, fastProvider, expected)
    expect(ledger).toMatchObject({ payments: ROUNDS, charges: ROUNDS, lost: 0, duplicatedPayments: 0, duplicatedCharges: 0 })
    await instance.kill()
    await one.stop()
  }, 180_000)

  test('the transactional completion through PgBouncer, its lease lost half-way (pgbouncer issue 759\'s pattern: an error inside a transaction while other clients\' statements are pipelined on the same server connection): rolled back, every other client answered its own result', async () => {
    // One server connection for everyone: the failed transaction's ROLLBACK
    // and the other clients' pipelined statements all travel it.
    const one = await PgBouncer.start({ host: db.host, port: db.port, database: db.name, poolSize: 1 })
    const options = { max: 4, prepare: false, fetch_types: false, onnotice: () => undefined }
    const pool = postgres(one.url(), options) as unknown as postgres.Sql<Record<string, never>>
    const others = postgres(one.url(), options)
    await sql`create table if not exists pgb_side_effects (key text not null, lease text not null)`
    const ROUNDS = 10
    const outcomes: string[] = []
    let echoed = 0
    let wrong = 0
    try {
      for (let i = 0; i < ROUNDS; i++) {
        const id = { tenant: TENANT, key: `pgb-tx-${crypto.randomUUID()}`, method: 'POST', path: '/api/payments', fingerprint: 'b'.repeat(64) }
        const claimed = await claim(pool, id, { ttlSeconds: 30, retentionSeconds: 86_400 })
        if (claimed.kind !== 'created') throw new Error(`claim: ${claimed.kind}`)
        // Other clients' statements, queued on their connections while the completion runs.
        const traffic = Array.from({ length: 8 }, (_, j) => others<{ echo: string }[]>`select ${`${i}:${j}`}::text as echo`
          .then(([row]) => { if (row?.echo === `${i}:${j}`) echoed++; else wrong++ }))
        const outcome = await complete(pool, claimed.lease, async (tx) => {
          await tx`insert into pgb_side_effects (key, lease) values (${id.key}, ${claimed.lease.lease})`
          // Taken over half-way (straight to PostgreSQL, as a reclaim would): the fence will miss.
          await sql`update idempotency_keys set lease = ${claimed.lease.lease}::bigint + 1 where tenant = ${id.tenant} and key = ${id.key}`
          return { status: 201, headers: {}, body: '{}' }
        }).then(() => 'committed', (error: unknown) => (error instanceof LeaseLostError ? 'lease-lost' : String(error)))
        outcomes.push(outcome)
        await Promise.all(traffic)
      }
      const [{ written }] = await sql<{ written: number }[]>`select count(*)::int as written from pgb_side_effects` as unknown as [{ written: number }]
      const [{ open }] = await sql<{ open: number }[]>`
        select count(*)::int as open from pg_stat_activity where datname = ${db.name} and state like 'idle in transaction%'` as unknown as [{ open: number }]
      // The next transaction on that server connection is a clean one.
      const after = await pool.begin(async (tx) => (await tx<{ xid: string | null }[]>`select pg_current_xact_id_if_assigned()::text as xid`)[0]!.xid)
      report('pgbouncer transactional completion, lease lost half-way', {
        rounds: ROUNDS, outcomes: JSON.stringify(Object.fromEntries([...new Set(outcomes)].map((o) => [o, outcomes.filter((x) => x === o).length]))),
        'rows written by them': written, 'other clients answered their own result': `${echoed} of ${echoed + wrong}`, 'sessions left in a transaction': open,
      })
      expect(outcomes).toEqual(Array(ROUNDS).fill('lease-lost'))
      expect(written).toBe(0)
      expect(wrong).toBe(0)
      expect(echoed).toBe(ROUNDS * 8)
      expect(open).toBe(0)
      expect(after).toBeNull()
    } finally {
      await Promise.all([pool.end({ timeout: 1 }), others.end({ timeout: 1 })])
      await one.stop()
    }
  }, 120_000)

  test('npm run migrate refuses the PgBouncer URL (without DATABASE_PGBOUNCER=1 too), as the service does', async () => {
    const proc = Bun.spawn([process.execPath, 'src/store/migrate-cli.ts'], { env: { ...process.env, DATABASE_URL: bouncer.url(), DATABASE_PGBOUNCER: '' }, stdout: 'pipe', stderr: 'pipe' })
    const [err, code] = await Promise.all([new Response(proc.stderr).text(), proc.exited])
    console.log(`[scale] pgbouncer: npm run migrate through PgBouncer: exit ${code}: ${err.trim().slice(0, 200)}`)
    expect(code).toBe(2)
    expect(err).toContain('looks like PgBouncer')
    expect(err).toContain('unsupported startup parameter')
  }, 30_000)
})
