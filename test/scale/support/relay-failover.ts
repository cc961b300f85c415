/**
 * The failover scenario with the network in the test's hands, shared by
 * test/scale/failover.scale.ts (its properties) and `npm run bench:scale`
 * (its figures): a primary, a standby streaming through a relay, the service
 * on a multi-host URL, retrying clients, then a slow link, a burst of keys, a
 * host crash of the primary and the standby's promotion. See the test's
 * header for the story.
 */
import postgres from 'postgres'
import { COMMIT_UNREPLICATED_METRIC } from '../../../src/store/durability'
import { createDatabase } from './database'
import { ms, paidId, tally, untilPaid, type Answer } from './load'
import { PostgresServer } from './postgres-server'
import { onTeardown, scoped, waitFor } from './processes'
import { TcpRelay } from './tcp-proxy'
import { adminClient, checkLedgers, report, startInstance, startProvider, STOP_DEADLINE_MS, type LedgerCheck } from './world'

export const KEYS = 150
/** New keys arriving while the standby lags: in asynchronous mode each draws a lease on the primary alone. */
export const BURST = 100
const PROVIDER_DELAY_MS = 200
/** How far the standby falls behind just before the crash. */
const LAG_MS = 1_000
/** Payments committed before the crash, so it lands mid-load. */
const PAID_BEFORE_CRASH = 40

export interface FailoverFigures extends LedgerCheck {
  readonly promoteMs: number
  /** From the SIGKILL to the first new payment (201, not a replay) answered by the service. */
  readonly failoverMs: number
  /** Keys whose final retry was answered with another payment than the client's first 2xx. */
  readonly changedAnswers: number
  readonly answers: Record<string, number>
  /** Lease values handed out on the promoted standby that the lost primary had handed out already. */
  readonly leasesHandedOutTwice: string[]
  /** New leases drawn on the promoted standby (the sample the line above is taken from). */
  readonly newLeases: number
  /** What the service said of its durability at start. */
  readonly unreplicatedGauge: string | undefined
  readonly warnedAtStart: boolean
}

/**
 * One run, in a scope of its own: whatever happens, its teardown (service
 * stop, relay close, clients' end, then every process killed and its folders
 * removed) is bounded step by step and touches nothing another run started.
 */
export function relayFailover(mode: 'synchronous' | 'asynchronous'): Promise<FailoverFigures> {
  return scoped(`failover (${mode})`, () => scenario(mode))
}

/** How long each teardown step may take: a relay's close, a client's end (a SIGTERMed service has its own, STOP_DEADLINE_MS). */
const STEP_MS = 10_000

async function scenario(mode: 'synchronous' | 'asynchronous'): Promise<FailoverFigures> {
  // Synchronous only once the standby streams: before, every commit (create database included) would wait for it.
  const primary = PostgresServer.init(`primary-${mode.slice(0, 5)}`, { synchronous_commit: "'on'" })
  await primary.start()
  const db = await createDatabase('failover', primary.url())
  const relay = await TcpRelay.start(primary.port)
  onTeardown('the relay to close', () => relay.stop(), STEP_MS)
  // Copied from the primary by pg_basebackup, synchronous_standby_names would
  // make the promoted standby wait forever for a standby of its own: every
  // commit hung. Empty, it runs alone until one is attached (docs/how-to/ha-patroni.md).
  // wal_retrieve_retry_interval: between two tries to reach a primary that
  // is gone, recovery sleeps this long, and a promotion asked for meanwhile
  // waited for it: promote took 0.4 s or 5.3 s (the 5 s default) by chance.
  const standby = PostgresServer.standbyOf(primary, 'standby1', { synchronous_standby_names: "''", wal_retrieve_retry_interval: "'500ms'" }, relay.port)
  await standby.start()
  const primarySql = adminClient(db.url)
  onTeardown('the primary\'s admin client to end', () => primarySql.end({ timeout: 0 }), STEP_MS)
  if (mode === 'synchronous') await requireSyncStandby(primarySql, 'standby1')
  await waitFor(`standby1 streaming (${mode})`, async () => {
    const [row] = await primarySql<{ state: string; sync_state: string }[]>`
      select state, sync_state from pg_stat_replication where application_name = 'standby1'`
    return row?.state === 'streaming' && row.sync_state === (mode === 'synchronous' ? 'sync' : 'async')
  })
  const standbySql = adminClient(standby.url(db.name))
  onTeardown('the standby\'s admin client to end', () => standbySql.end({ timeout: 0 }), STEP_MS)
  const provider = await startProvider(PROVIDER_DELAY_MS)
  const url = `postgres://postgres@127.0.0.1:${primary.port},127.0.0.1:${standby.port}/${db.name}?target_session_attrs=read-write`
  const service = await startInstance(`failover-${mode}`, { databaseUrl: url, providerUrl: provider.url, ttlSeconds: 3 })
  // Its own deadline (STOP_DEADLINE_MS), which names it and quotes its last lines.
  onTeardown(`service failover-${mode} to stop`, () => service.stop(), STOP_DEADLINE_MS + STEP_MS)

  const metrics = await (await fetch(`${service.url}/metrics`)).text()
  const unreplicatedGauge = new RegExp(`^${COMMIT_UNREPLICATED_METRIC} (\\S+)$`, 'm').exec(metrics)?.[1]
  const warnedAtStart = service.output().includes('a failover may lose acknowledged payments')

  const run = crypto.randomUUID().slice(0, 8)
  const keys = Array.from({ length: KEYS + BURST }, (_, i) => ({ key: `fo-${run}-${i}`, customer: `cus_fo_${run}_${i}`, amount: 500 + i }))
  const results = new Map<string, Answer[]>()
  const pay = async ({ key, customer, amount }: (typeof keys)[number]) => {
    results.set(key, await untilPaid(() => service.url, key, { amount, currency: 'EUR', customer }, { pauseMs: 300, deadlineMs: 120_000 }))
  }
  const clients = keys.slice(0, KEYS).map(async (k, i) => {
    await Bun.sleep(i * 25) // arrivals spread over the run: the load's shape, not synchronisation
    await pay(k)
  })

  let killedAt = 0
  let promoteMs = 0
  let handedOutOnPrimary = new Map<string, string>()
  let replicated = new Map<string, string>()
  const burst: Promise<void>[] = []
  const leasesOf = async (sql: postgres.Sql) =>
    new Map((await sql<{ key: string; lease: string }[]>`select key, lease::text as lease from idempotency_key_states`).map((r) => [r.key, r.lease] as const))
  const chaos = (async () => {
    await waitFor(`${PAID_BEFORE_CRASH} payments before the crash`, async () => {
      const [row] = await primarySql<{ n: number }[]>`select count(*)::int as n from payments`
      return row!.n >= PAID_BEFORE_CRASH
    }, 60_000, 20)
    relay.hold()
    for (const k of keys.slice(KEYS)) burst.push(pay(k))
    await Bun.sleep(LAG_MS) // the slow link lasts a second: the scenario's time
    // What the primary handed out, lost WAL included (asynchronous mode: committed there alone).
    if (mode === 'asynchronous') handedOutOnPrimary = await leasesOf(primarySql)
    await primary.kill()
    killedAt = performance.now()
    relay.cut()
    // All the standby will ever have of the old primary, read before anything new is written on it.
    replicated = await leasesOf(standbySql)
    standby.promote()
    promoteMs = performance.now() - killedAt
  })()
  await Promise.all([...clients, chaos])
  await Promise.all(burst)

  const all = [...results.values()].flat()
  const freshAfter = all.filter((a) => a.status === 201 && !a.replayed && a.at - a.ms > killedAt).map((a) => a.at - killedAt)
  const failoverMs = Math.min(...freshAfter)

  // Every client asks once more, as one whose answer was lost would, through
  // another instance: the one that answered keeps its answers in its replay
  // cache and would replay them, so only an instance without that memory
  // shows what the database itself kept.
  const other = await startInstance(`failover-${mode}-late`, { databaseUrl: url, providerUrl: provider.url, ttlSeconds: 3 })
  const late = await Promise.all(keys.map(async ({ key, customer, amount }) =>
    [key, paidId(await untilPaid(() => other.url, key, { amount, currency: 'EUR', customer }, { deadlineMs: 60_000 }))] as const))
  await other.stop()
  const changedAnswers = late.filter(([key, id]) => id !== paidId(results.get(key)!)).length

  const expected = new Map(keys.map(({ key, customer }) => [key, { customer, answeredId: paidId(results.get(key)!)! }]))
  const ledger = await checkLedgers(standbySql, provider, expected)
  // Leases drawn on the promoted standby: every key's current lease that it did not inherit.
  const now = await leasesOf(standbySql)
  const drawnAfter = [...now].filter(([key, lease]) => replicated.get(key) !== lease).map(([, lease]) => lease)
  const before = new Set(handedOutOnPrimary.values())
  const leasesHandedOutTwice = drawnAfter.filter((lease) => before.has(lease))
  const figures = { ...ledger, promoteMs, failoverMs, changedAnswers, answers: tally(all), leasesHandedOutTwice, newLeases: drawnAfter.length, unreplicatedGauge, warnedAtStart }
  report(`failover (${mode} replication)`, {
    keys: KEYS + BURST, 'burst while lagging': BURST, 'lag injected': `${LAG_MS}ms`, answers: JSON.stringify(figures.answers),
    payments: ledger.payments, charges: ledger.charges, lost: ledger.lost, missing: ledger.missing,
    'duplicated payments': ledger.duplicatedPayments, 'duplicated charges': ledger.duplicatedCharges,
    'answers changed on retry': changedAnswers, 'unmatched references': ledger.unmatchedReferences,
    promote: ms(promoteMs), 'failover time': ms(failoverMs),
    ...(mode === 'asynchronous' ? { 'leases on the lost primary': handedOutOnPrimary.size, 'new leases on the promoted standby': drawnAfter.length, 'handed out twice': leasesHandedOutTwice.length } : {}),
    [COMMIT_UNREPLICATED_METRIC]: unreplicatedGauge,
  })
  return figures
}

/** Makes `name` the synchronous standby and waits until the primary says it is. */
export async function requireSyncStandby(sql: postgres.Sql, name: string): Promise<void> {
  await sql.unsafe(`alter system set synchronous_standby_names = '${name}'`)
  await sql`select pg_reload_conf()`
  await waitFor(`${name} as the synchronous standby`, async () =>
    (await sql`select 1 from pg_stat_replication where application_name = ${name} and sync_state = 'sync'`).length === 1)
}

