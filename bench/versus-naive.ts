/**
 * The service against the yardstick a user would pick (bench/naive-app.ts),
 * as a user would compare them: each round on a fresh database and a freshly
 * started process, `wrk` as the load, both charging through the same
 * provider process. One round:
 *
 *   1. a database of its own (a copy of the migrated template, or of the one
 *      seeded with 1M keys; the naive app's starts empty and makes its tables);
 *   2. the process started on it (`bun src/main.ts` in production mode, or the
 *      naive app), a second of unmeasured load (its connections, its prepared
 *      statements), and for replays the keys they replay;
 *   3. the measured seconds: wrk's answers and latencies, the CPU of the
 *      process, of PostgreSQL, of the provider and of wrk (/proc), and when
 *      the server has it, pg_stat_statements of that database alone;
 *   4. the process stopped (SIGTERM: it drains), then exactly once counted
 *      where it lands: the round's payments in the table, its charges in the
 *      provider's ledger (every body of a round names the round's customer);
 *   5. the database dropped.
 */
import postgres from 'postgres'
import { chargesAt } from '../test/support/server'
import { cpuMicros, machineTicks } from './cpu'
import { NAIVE_API_KEY, startNaiveApp } from './naive-process'
import { readStatements, resetStatements, type StatementRow } from './pg-statements'
import type { BenchProvider } from './provider'
import { cpuSpent, type BenchServer } from './server'
import { BENCH_API_KEY, startService } from './service'
import { benchBody, runWrk, type WrkResult } from './wrk'

export type Side = 'service' | 'naive'
export type Kind = 'fresh' | 'replay'

export interface RoundSpec {
  readonly side: Side
  readonly kind: Kind
  readonly provider: BenchProvider
  readonly connections: number
  readonly seconds: number
  /** The service's database is a copy of this template (migrated; maybe seeded). */
  readonly template: string
  /** A name for the round, unique in the run: its database, its customer and its keys carry it. */
  readonly tag: string
  /** The service of another checkout (an earlier release), on an empty database that it migrates itself. */
  readonly serviceDir?: string | undefined
  /** More of the service's environment (e.g. WORKERS). */
  readonly env?: Readonly<Record<string, string>> | undefined
}

export interface RoundResult {
  readonly load: WrkResult
  /** CPU per answer, µs. */
  readonly cpuUs: { readonly process: number; readonly postgres: number; readonly provider: number; readonly wrk: number }
  /** Share of the machine busy during the measured seconds, and how much of it was none of ours (other users). */
  readonly machine: { readonly busyPercent: number; readonly othersPercent: number }
  readonly exactlyOnce: ExactlyOnce
  /** pg_stat_statements of the round's database, when loaded. */
  readonly statements: readonly StatementRow[] | undefined
  /** HOT share of the key table's updates (service rounds). */
  readonly hotPercent: number | undefined
}

export interface ExactlyOnce {
  readonly payments: number
  readonly charges: number
  /** Payments sharing one charge, and payments whose charge the provider does not have: both must be 0. */
  readonly sharedCharges: number
  readonly withoutCharge: number
  readonly ok: boolean
}

/** Completed keys a replay round cycles through. */
const REPLAY_KEYS = 2_000
/**
 * Unmeasured load before a round's measured seconds: the process's JIT
 * settles. Measured with perf (cpu-clock, per thread) at 32 connections:
 * after 2 s of load the service's JIT compiler thread still took 126 µs per
 * payment (the naive app's 59: less code to compile), after 20 s 12 µs (the
 * naive app's 1); the main thread was 405 µs then 255 µs (the naive app's
 * 272, then 256). 1 s measured mostly the first seconds of a process's life.
 */
export const WARMUP_SECONDS = Number(process.env.BENCH_WARMUP_SECONDS ?? 5)

export async function runRound(server: BenchServer, spec: RoundSpec): Promise<RoundResult> {
  const database = `idem_bench_${spec.tag.replace(/\W/g, '_')}_${crypto.randomUUID().slice(0, 6)}`
  const url = await server.create(database, spec.side === 'service' && !spec.serviceDir ? spec.template : undefined)
  const customer = `cus_${spec.tag}`
  const proc = spec.side === 'service'
    ? await startService(url, spec.provider.url, { METRICS_CACHE_MS: '0', ...spec.env }, [], spec.serviceDir)
    : await startNaiveApp(url, spec.provider.url)
  const path = spec.side === 'service' ? '/api/payments' : '/payments'
  const headers = { authorization: `Bearer ${spec.side === 'service' ? BENCH_API_KEY : NAIVE_API_KEY}`, 'content-type': 'application/json' }
  const sql = postgres(url, { max: 1, onnotice: () => undefined })
  let stopped = false
  try {
    await runWrk({ url: `${proc.url}${path}`, connections: spec.connections, seconds: WARMUP_SECONDS, headers, keys: { kind: 'fresh', prefix: `${spec.tag}-w-` }, customer })
    if (spec.kind === 'replay') await makeKeys(`${proc.url}${path}`, headers, `${spec.tag}-r-`, customer)
    const statementsOn = server.statements && (await resetStatements(sql)).ok
    const tableBefore = spec.side === 'service' ? await keyUpdates(sql) : undefined

    const pg = await server.cpu(database)
    const own = { process: cpuMicros(proc.proc.pid), provider: cpuMicros(spec.provider.pid) }
    const machine = machineTicks()
    const load = await runWrk({
      url: `${proc.url}${path}`, connections: spec.connections, seconds: spec.seconds, headers, customer,
      keys: spec.kind === 'fresh' ? { kind: 'fresh', prefix: `${spec.tag}-f-` } : { kind: 'cycle', prefix: `${spec.tag}-r-`, count: REPLAY_KEYS },
    })
    const machineAfter = machineTicks()
    if (load.non2xx > 0 || load.socketErrors > 0) {
      const sample = await fetch(`${proc.url}${path}`, { method: 'POST', headers: { ...headers, 'idempotency-key': `${spec.tag}-probe` }, body: benchBody(0, customer) })
      throw new Error(`${spec.side} ${spec.kind}: ${load.non2xx} answers not 2xx, ${load.socketErrors} socket errors of ${load.requests}; one more request: ${sample.status} ${await sample.text()}`)
    }
    const postgresUs = cpuSpent(pg, await server.cpu(database))
    const processUs = cpuMicros(proc.proc.pid) - own.process
    const providerUs = cpuMicros(spec.provider.pid) - own.provider
    const statements = statementsOn ? await readStatements(sql, 8) : undefined
    const tableAfter = tableBefore ? await keyUpdates(sql) : undefined

    await proc.stop()
    stopped = true
    const exactlyOnce = await countOnce(sql, spec.side, spec.provider.url, customer)
    const per = (us: number) => Math.round(us / Math.max(1, load.requests))
    const busy = machineAfter.busy - machine.busy
    const total = machineAfter.total - machine.total
    const oursTicks = (processUs + postgresUs + providerUs + load.cpuUs) / 10_000
    return {
      load,
      cpuUs: { process: per(processUs), postgres: per(postgresUs), provider: per(providerUs), wrk: per(load.cpuUs) },
      machine: { busyPercent: Math.round((busy / total) * 100), othersPercent: Math.max(0, Math.round(((busy - oursTicks) / total) * 100)) },
      exactlyOnce,
      statements,
      hotPercent: tableBefore && tableAfter ? hotShare(tableBefore, tableAfter) : undefined,
    }
  } finally {
    await sql.end()
    if (!stopped) await proc.stop().catch(() => undefined)
    await server.drop(database)
  }
}

/** The keys a replay round replays: REPLAY_KEYS fresh requests, completed, 32 at a time. */
async function makeKeys(url: string, headers: Record<string, string>, prefix: string, customer: string): Promise<void> {
  let next = 0
  await Promise.all(Array.from({ length: 32 }, async () => {
    while (next < REPLAY_KEYS) {
      const n = next++
      const response = await fetch(url, { method: 'POST', headers: { ...headers, 'idempotency-key': `${prefix}${n}` }, body: benchBody(n, customer) })
      if (response.status !== 201) throw new Error(`making replay key ${n}: ${response.status} ${await response.text()}`)
      await response.arrayBuffer()
    }
  }))
}

/** Every payment of the round (its customer) has its own charge at the provider, and the provider charged nothing else for it. */
async function countOnce(sql: postgres.Sql, side: Side, providerUrl: string, customer: string): Promise<ExactlyOnce> {
  const table = side === 'service' ? 'payments' : 'naive_payments'
  const rows = await sql.unsafe<{ ref: string }[]>(`select provider_ref as ref from ${table} where customer = $1`, [customer])
  const charges = new Set((await chargesAt(providerUrl, customer)).map((charge) => charge.id))
  const refs = new Set(rows.map((row) => row.ref))
  const sharedCharges = rows.length - refs.size
  const withoutCharge = [...refs].filter((ref) => !charges.has(ref)).length
  return { payments: rows.length, charges: charges.size, sharedCharges, withoutCharge, ok: sharedCharges === 0 && withoutCharge === 0 && rows.length === charges.size }
}

async function keyUpdates(sql: postgres.Sql): Promise<{ updates: number; hot: number }> {
  await sql`select pg_stat_clear_snapshot()`
  const [row] = await sql<{ updates: number; hot: number }[]>`
    select n_tup_upd::int as updates, n_tup_hot_upd::int as hot from pg_stat_user_tables where relname = 'idempotency_keys'`
  return row ?? { updates: 0, hot: 0 }
}

function hotShare(before: { updates: number; hot: number }, after: { updates: number; hot: number }): number | undefined {
  const updates = after.updates - before.updates
  return updates > 0 ? Math.round(((after.hot - before.hot) / updates) * 100) : undefined
}

/** The median of `values` (the middle one, or the mean of the two middle ones). */
export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}
