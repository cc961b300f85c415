/**
 * High availability with a real HA manager: a 3-node Patroni cluster
 * (synchronous_mode on, one etcd, test/scale/support/patroni.ts) under load,
 * through the three ways a deployment reaches its primary:
 *
 * - `multi-host`: a multi-host DATABASE_URL naming the three nodes with
 *   target_session_attrs=read-write (the service asks for `primary`, src/store/db.ts);
 * - `haproxy`: HAProxy in TCP mode, checking each node's Patroni REST `/primary`;
 * - `pgbouncer`: the same HAProxy in front of one PgBouncer per node
 *   (transaction mode, DATABASE_PGBOUNCER=1).
 *
 * 32 careful clients (retrying network errors, 5xx and 409 with the same
 * key) pay new keys one after another, spread over the three service
 * instances, through a provider simulator with a small delay. Each fault ends
 * with the ledgers counted where they land (the payments table on the
 * current leader, the provider's charges): every key completed, no answered
 * payment lost, no key paid or charged twice.
 *
 * In order, on the same cluster: a switchover (patronictl), a failover (the
 * leader's Patroni and PostgreSQL SIGKILLed: detection is Patroni's ttl and
 * loop_wait, so the failover time includes it), the crashed node coming back
 * (it rejoins as a replica, rewound, and never takes a write), and a stalled
 * synchronous standby (every commit waits for it: readiness must say so and
 * requests must fail fast instead of hanging).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { sessionSettingsSql } from '../../src/store/db'
import { DATABASE_WAIT_MS } from '../../src/store/health'
import { COMMIT_UNREPLICATED_METRIC } from '../../src/store/durability'
import { createDatabase, type OwnDatabase } from './support/database'
import { PrimaryProxy } from './support/haproxy'
import { ContinuousLoad, ms, oddAnswers, paidId, post, tally, untilPaid, type Answer } from './support/load'
import { PatroniCluster, type PatroniNode } from './support/patroni'
import { PgBouncer } from './support/pgbouncer'
import { cleanupAll, missing, waitFor } from './support/processes'
import { adminClient, checkLedgers, report, startInstance, startProvider, TENANT, type Instance, type Provider } from './support/world'

const skip = missing(['patroni', 'patronictl', 'etcd', 'haproxy', 'pgbouncer', 'pg_rewind', 'postgres'])
if (skip) console.log(`[scale] patroni: ${skip}`)

const CLIENTS = 32
const PROVIDER_DELAY_MS = 50
const TTL_SECONDS = 3
/** Payments before a fault is injected, so it lands in the middle of the load. */
const PAID_BEFORE_FAULT = 60
/** Fresh payments each path must serve after a fault before the load stops. */
const FRESH_AFTER_FAULT = 15
const PATHS = ['multi-host', 'haproxy', 'pgbouncer'] as const
/**
 * Between the test sending a request and the service starting its wait for
 * the database: the request's way through the loopback and the router, which
 * takes milliseconds, and up to a second on a machine whose cores are busy.
 */
const ARRIVAL_MARGIN_MS = 1_000

describe.skipIf(skip !== undefined)('a 3-node Patroni cluster (synchronous mode) under load', () => {
  let cluster: PatroniCluster
  let db: OwnDatabase
  let proxy: PrimaryProxy
  let provider: Provider
  const instances = new Map<string, Instance>()
  /** The killed node, for the rejoin test. */
  let crashed: PatroniNode | undefined
  let crashedAt = 0

  beforeAll(async () => {
    cluster = await PatroniCluster.start()
    const leader = (await cluster.leader())!
    db = await createDatabase('patroni', leader.url())
    const admin = adminClient(db.url)
    // Behind PgBouncer the session settings come from the role (docs/how-to/pgbouncer.md); the catalog is replicated.
    await admin.unsafe(sessionSettingsSql(db.user, db.name))
    await admin.end({ timeout: 1 })
    const bouncers = await Promise.all(cluster.nodes.map((node) => PgBouncer.start({ host: '127.0.0.1', port: node.pgPort, database: db.name, poolSize: 10 })))
    proxy = await PrimaryProxy.start([
      { name: 'pg', servers: cluster.nodes.map((n) => ({ name: n.name, port: n.pgPort, checkPort: n.restPort })) },
      { name: 'pgb', servers: cluster.nodes.map((n, i) => ({ name: n.name, port: bouncers[i]!.port, checkPort: n.restPort })) },
    ])
    provider = await startProvider(PROVIDER_DELAY_MS)
    const urls: Record<(typeof PATHS)[number], string> = {
      'multi-host': cluster.multiHostUrl(db.name, 'read-write'),
      haproxy: `postgres://postgres@127.0.0.1:${proxy.port('pg')}/${db.name}`,
      pgbouncer: `postgres://postgres@127.0.0.1:${proxy.port('pgb')}/${db.name}`,
    }
    for (const path of PATHS)
      instances.set(path, await startInstance(path, { databaseUrl: urls[path], providerUrl: provider.url, ttlSeconds: TTL_SECONDS, pgbouncer: path === 'pgbouncer' }))
  }, 240_000)

  afterAll(async () => {
    await cleanupAll()
    // The database lived on the cluster, which is gone with its temp dirs.
  })

  function load(prefix: string): ContinuousLoad {
    return new ContinuousLoad({
      clients: CLIENTS,
      targets: PATHS.map((path) => ({ name: path, url: () => instances.get(path)!.url })),
      prefix: `${prefix}-${crypto.randomUUID().slice(0, 6)}`,
      thinkMs: 200,
    }).start()
  }

  /** The payments table on the current leader, and the provider's ledger, for every key of the load. */
  async function ledger(run: ContinuousLoad) {
    const leader = await waitFor('a leader', () => cluster.leader())
    const sql = adminClient(leader.url(db.name))
    try {
      return await checkLedgers(sql, provider, run.ledgerKeys())
    } finally {
      await sql.end({ timeout: 1 })
    }
  }

  /** Waits until `run` has PAID_BEFORE_FAULT more payments than at the call. */
  async function midLoad(run: ContinuousLoad): Promise<void> {
    const base = run.paid()
    await waitFor(`${PAID_BEFORE_FAULT} payments under load`, () => run.paid() - base >= PAID_BEFORE_FAULT, 60_000, 50)
  }

  /** Waits until every path served FRESH_AFTER_FAULT new payments sent after `since`; returns when. */
  async function servedAgain(run: ContinuousLoad, since: number, timeoutMs = 90_000): Promise<number> {
    return waitFor(`${FRESH_AFTER_FAULT} fresh payments on every path`, () =>
      PATHS.every((path) => run.fresh(since, path).length >= FRESH_AFTER_FAULT) && performance.now(), timeoutMs, 100)
  }

  /** Per path: the longest stretch without a 2xx from `from` until every path was served again. */
  function gaps(run: ContinuousLoad, from: number, to: number): Record<string, string> {
    return Object.fromEntries(PATHS.map((p) => [`${p}: longest gap without a 2xx`, ms(run.longestGap(from, to, p))]))
  }

  /** First fresh payment per path after `since`, in ms from it. */
  function firstFresh(run: ContinuousLoad, since: number): Record<string, number> {
    return Object.fromEntries(PATHS.map((path) => [path, Math.min(...run.fresh(since, path).map((a) => a.at - since))]))
  }

  /** What the instances logged as failures (the 500s' causes), distinct, for the report. */
  function serviceErrors(): string {
    const lines = [...instances.values()].flatMap((i) => i.output().split('\n').filter((l) => /processing failed|unhandled error|server error/.test(l)))
    return JSON.stringify([...new Set(lines.map((l) => l.replace(/^.*?(processing failed|unhandled error|server error)/, '$1').slice(0, 160)))].slice(0, 5))
  }

  /** The 5xx answers of `run`, by status (the failover's are written in docs/how-to/ha-patroni.md). */
  function serverErrors(run: ContinuousLoad): Record<string, number> {
    return Object.fromEntries(Object.entries(tally(run.answers())).filter(([label]) => /^5\d\d/.test(label)))
  }

  function expectExactlyOnce(run: ContinuousLoad, check: Awaited<ReturnType<typeof ledger>>): void {
    expect(run.keys.filter((k) => k.error).map((k) => `${k.key}: ${k.error}`)).toEqual([])
    expect(run.conflictingAnswers()).toEqual([])
    expect(check).toMatchObject({
      payments: run.keys.length, charges: run.keys.length, lost: 0, missing: 0,
      duplicatedPayments: 0, duplicatedCharges: 0, unmatchedReferences: 0,
    })
  }

  test('commits wait for a synchronous standby: the service exports idempotency_database_commit_unreplicated 0', async () => {
    for (const [path, instance] of instances) {
      const text = await (await fetch(`${instance.url}/metrics`)).text()
      expect([path, text.includes(`${COMMIT_UNREPLICATED_METRIC} 0`)]).toEqual([path, true])
      expect(instance.output()).not.toContain('a failover may lose acknowledged payments')
    }
  })

  test('switchover (patronictl) under load: every key paid once, charged once, on every path', async () => {
    const run = load('sw')
    await midLoad(run)
    const before = await cluster.waitHealthy()
    const from = before.find((m) => m.role === 'leader')!.name
    const to = before.find((m) => m.role === 'sync_standby')!.name
    const startedAt = performance.now()
    cluster.switchover(from, to)
    const newLeader = await waitFor(`${to} to lead`, async () => (await cluster.node(to).isPrimary()) && performance.now(), 60_000, 100)
    const served = await servedAgain(run, startedAt)
    await run.stop()
    const check = await ledger(run)
    const first = firstFresh(run, startedAt)
    report('patroni switchover under load', {
      clients: CLIENTS, keys: run.keys.length, from, to, 'new primary after': ms(newLeader - startedAt),
      ...Object.fromEntries(PATHS.map((p) => [`${p}: first new payment after`, ms(first[p]!)])),
      ...gaps(run, startedAt, served),
      answers: JSON.stringify(tally(run.answers())), odd: JSON.stringify(oddAnswers(run.answers())), 'service errors': serviceErrors(),
      payments: check.payments, charges: check.charges, lost: check.lost,
    })
    expectExactlyOnce(run, check)
    // Shorter than the claim's deadline (2.4 s in the runs seen, against 5 s): in-request recovery absorbs it whole (SPEC invariant 11).
    expect(serverErrors(run)).toEqual({})
    await cluster.waitHealthy()
  }, 300_000)

  test('failover (SIGKILL of the leader\'s Patroni and PostgreSQL) under load: the synchronous standby takes over, nothing answered is lost', async () => {
    const run = load('fo')
    await midLoad(run)
    const before = await cluster.waitHealthy()
    const victim = cluster.node(before.find((m) => m.role === 'leader')!.name)
    const heir = before.find((m) => m.role === 'sync_standby')!.name
    await victim.kill()
    crashed = victim
    crashedAt = performance.now()
    const promoted = await waitFor('a new leader', async () => {
      const leader = await cluster.leader()
      return leader ? { name: leader.name, at: performance.now() } : undefined
    }, 60_000, 100)
    const served = await servedAgain(run, crashedAt)
    await run.stop()
    const check = await ledger(run)
    const first = firstFresh(run, crashedAt)
    const { ttl, loopWait } = cluster.timing
    report('patroni failover under load', {
      clients: CLIENTS, keys: run.keys.length, killed: victim.name, 'new leader': promoted.name, ttl: `${ttl}s`, loop_wait: `${loopWait}s`,
      'detection + promotion (kill to new primary)': ms(promoted.at - crashedAt),
      ...Object.fromEntries(PATHS.map((p) => [`${p}: kill to first new payment`, ms(first[p]!)])),
      ...gaps(run, crashedAt, served),
      answers: JSON.stringify(tally(run.answers())), odd: JSON.stringify(oddAnswers(run.answers())), 'service errors': serviceErrors(),
      payments: check.payments, charges: check.charges, lost: check.lost,
    })
    // Synchronous mode: only the synchronous standby may be promoted (it has every acknowledged commit).
    expect(promoted.name).toBe(heir)
    expectExactlyOnce(run, check)
    // Every path came back within Patroni's detection (ttl) plus a few loops: a
    // service stuck on a dead connection (no keepalive, HAProxy not cutting
    // sessions) would take the TCP timeout instead.
    for (const path of PATHS) expect([path, first[path]! < (ttl + 4 * loopWait + 10) * 1000]).toEqual([path, true])
  }, 300_000)

  test('the crashed primary comes back: Patroni rejoins it as a replica (pg_rewind) and it never takes a write', async () => {
    const node = crashed
    if (!node) throw new Error('needs the failover test first')
    const run = load('rj')
    await midLoad(run)
    const leader = (await cluster.leader())!
    // Watch the returning node from its first accepted connection: is it ever a primary?
    const seen: { inRecovery: boolean; at: number }[] = []
    let watching = true
    const watcher = (async () => {
      while (watching) {
        const sql = node.connect()
        try {
          const [row] = await sql<{ r: boolean }[]>`select pg_is_in_recovery() as r`
          seen.push({ inRecovery: row!.r, at: performance.now() })
        } catch { /* not accepting connections yet */ } finally {
          await sql.end({ timeout: 0 })
        }
        await Bun.sleep(50)
      }
    })()
    const restartedAt = performance.now()
    node.start()
    await cluster.waitHealthy(3, 120_000)
    const rejoinedAt = performance.now()
    await servedAgain(run, restartedAt)
    watching = false
    await watcher
    await run.stop()
    const check = await ledger(run)

    // Its timeline is the new leader's, it is in recovery, and nothing was written on it since it came back.
    const sql = node.connect(db.name)
    try {
      // The timeline it streams on (its last restartpoint may still be on the old one), and
      // rows inserted, updated or deleted by its own sessions in any table since it came back.
      const [mine] = await sql<{ timeline: number; recovery: boolean; inserted: number }[]>`
        select (select received_tli from pg_stat_wal_receiver) as timeline, pg_is_in_recovery() as recovery,
               coalesce((select sum(n_tup_ins + n_tup_upd + n_tup_del) from pg_stat_user_tables), 0)::int as inserted`
      const theirs = { timeline: (await leader.status())?.timeline ?? -1 } // Patroni's: the timeline the leader writes on
      const members = await cluster.members()
      const rewound = /running pg_rewind|pg_rewind exit code=0/.test(node.log)
      report('patroni rejoin of the crashed primary', {
        node: node.name, role: members.find((m) => m.name === node.name)?.role, 'restart to streaming': ms(rejoinedAt - restartedAt),
        'pg_rewind ran': rewound, timeline: mine!.timeline, 'leader timeline': theirs!.timeline,
        'connections answered while rejoining': seen.length, 'of them in recovery': seen.filter((s) => s.inRecovery).length,
        'rows written on it since its return (any table)': mine!.inserted, keys: run.keys.length, payments: check.payments, lost: check.lost,
      })
      expect(seen.length).toBeGreaterThan(0)
      expect(seen.every((s) => s.inRecovery)).toBe(true)
      expect(mine!.recovery).toBe(true)
      expect(mine!.timeline).toBe(theirs!.timeline)
      expect(mine!.inserted).toBe(0)
      expect(members.find((m) => m.name === node.name)?.role).not.toBe('leader')
      // It crashed with WAL the standby never confirmed (the load was running): it had to be rewound to follow.
      expect(rewound).toBe(true)
    } finally {
      await sql.end({ timeout: 1 })
    }
    expectExactlyOnce(run, check)
  }, 300_000)

  test('a stalled synchronous standby (its walreceiver SIGSTOPped): /readyz goes 503 within seconds, requests fail fast with 503 instead of hanging, nothing is lost', async () => {
    const members = await cluster.waitHealthy()
    const standby = cluster.node(members.find((m) => m.role === 'sync_standby')!.name)
    const receivers = standby.postgresProcesses(/walreceiver/)
    expect(receivers).toHaveLength(1)
    const STALL_MS = 12_000
    const stalledAt = performance.now()
    process.kill(receivers[0]!, 'SIGSTOP')
    const notReady = new Map<string, number>()
    interface Sent { path: string; key: string; customer: string; amount: number; sentAt: number; answer: Promise<Answer>; answeredAt?: number }
    const sent: Sent[] = []
    let resumedAt = Number.POSITIVE_INFINITY
    try {
      // Every 100 ms, each path is asked /readyz and sent one new payment.
      const run = crypto.randomUUID().slice(0, 6)
      for (let i = 0; performance.now() - stalledAt < STALL_MS; i++) {
        for (const [path, instance] of instances) {
          if (!notReady.has(path)) {
            const status = (await fetch(`${instance.url}/readyz`).catch(() => undefined))?.status
            if (status === 503) notReady.set(path, performance.now() - stalledAt)
          }
          const key = `stall-${run}-${path}-${i}`
          const body = { amount: 700 + i, currency: 'EUR', customer: `cus_${key}` }
          const entry: Sent = { path, key, customer: body.customer, amount: body.amount, sentAt: performance.now(), answer: post(instance.url, key, body, STALL_MS * 2) }
          void entry.answer.then(() => { entry.answeredAt = performance.now() })
          sent.push(entry)
        }
        await Bun.sleep(100)
      }
    } finally {
      process.kill(receivers[0]!, 'SIGCONT')
      resumedAt = performance.now()
    }
    const answers = await Promise.all(sent.map((s) => s.answer))
    const ready = await waitFor('every instance ready again', async () => {
      for (const instance of instances.values()) if ((await fetch(`${instance.url}/readyz`)).status !== 200) return false
      return performance.now()
    }, 30_000, 100)

    // Sent once every path reported not ready, and whose wait for the
    // database (DATABASE_WAIT_MS, server.ts) ended before the standby
    // resumed: answered 503 problem+json at the end of that wait. A request
    // sent in the stall's last DATABASE_WAIT_MS is still waiting when the
    // standby resumes, and is rightly served (201): it is left out (before
    // the service waited for the database, every request was answered at once).
    const lastNotReady = Math.max(...notReady.values())
    const withAnswers = sent.map((s, i) => ({ ...s, a: answers[i]! }))
    const waitEndedInStall = (s: Sent) => s.sentAt + DATABASE_WAIT_MS + ARRIVAL_MARGIN_MS < resumedAt
    const afterGate = withAnswers.filter((s) => s.sentAt - stalledAt > lastNotReady + 100 && waitEndedInStall(s))
    // Waited for the standby: answered only after it resumed, though its own
    // wait for the database had ended before (a claim's commit waiting for
    // the standby, with no client-side deadline to end it).
    const hung = sent.filter((s) => waitEndedInStall(s) && (s.answeredAt === undefined || s.answeredAt > resumedAt))
    report('patroni stalled synchronous standby', {
      standby: standby.name, stall: ms(STALL_MS),
      ...Object.fromEntries(PATHS.map((p) => [`${p}: /readyz 503 after`, notReady.has(p) ? ms(notReady.get(p)!) : 'never'])),
      'requests sent during the stall': sent.length, 'answered after the resume': sent.filter((s) => (s.answeredAt ?? Infinity) > resumedAt).length,
      'of them waiting for the standby (hung)': hung.length,
      'answers': JSON.stringify(tally(answers)), 'after the gate': afterGate.length, 'after the gate: slowest': ms(Math.max(...afterGate.map((s) => s.a.ms))),
      'slowest answer': ms(Math.max(...answers.map((a) => a.ms))),
      'ready again after resume': ms(ready - resumedAt),
    })
    for (const path of PATHS) expect([path, notReady.get(path) ?? Number.POSITIVE_INFINITY]).toEqual([path, expect.any(Number)])
    for (const path of PATHS) expect([path, notReady.get(path)! < 5_000]).toEqual([path, true])
    expect(afterGate.length).toBeGreaterThan(0)
    for (const s of afterGate) {
      expect([s.key, s.a.status]).toEqual([s.key, 503])
      expect(s.a.detail ?? '').toContain('"status":503')
      // It waits for the database up to DATABASE_WAIT_MS (a failover's seconds), then is refused: never hung.
      expect(s.a.ms).toBeLessThan(DATABASE_WAIT_MS + 1_000)
    }

    // The standby is back: every key sent during the stall is paid once, charged once.
    const retried = await Promise.all(sent.map(async (s) => {
      const tries = await untilPaid(() => instances.get(s.path)!.url, s.key, { amount: s.amount, currency: 'EUR', customer: s.customer }, { deadlineMs: 60_000 })
      return [s.key, { customer: s.customer, answeredId: paidId(tries)! }] as const
    }))
    const leader = (await cluster.leader())!
    const sql = adminClient(leader.url(db.name))
    try {
      const check = await checkLedgers(sql, provider, new Map(retried))
      expect(check).toMatchObject({ payments: sent.length, charges: sent.length, lost: 0, missing: 0, duplicatedPayments: 0, duplicatedCharges: 0 })
      const [{ processing }] = await sql<{ processing: number }[]>`select count(*)::int as processing from idempotency_key_states where tenant = ${TENANT} and status = 'processing'` as unknown as [{ processing: number }]
      expect(processing).toBe(0)
    } finally {
      await sql.end({ timeout: 1 })
    }
    // Sent before the gate closed, their claims' commits waited for the
    // standby: the claim's client-side deadline answers them (503) instead
    // of letting them wait for the standby's return, however long that is.
    expect(hung.map((s) => `${s.key} answered ${s.answeredAt === undefined ? 'never' : `${ms(s.answeredAt - s.sentAt)} after it was sent`}`)).toEqual([])
  }, 300_000)
})
