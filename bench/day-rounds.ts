/**
 * One round of the day-of-traffic bench (bench/day-of-traffic.ts): the
 * service started as users start it on a database, fresh payments at full
 * speed after a warm-up, the service stopped; what the round did to the key
 * table (sequential scans, keys purged) and exactly once counted for the
 * round's own customer. And the VACUUM (FREEZE) phase: the same load in
 * windows while one VACUUM (FREEZE) of the key table runs beside it.
 */
import postgres from 'postgres'
import { chargesAt } from '../test/support/server'
import { waitFor } from '../test/support/wait'
import { freshLoad, type FreshLoad, type LoadTool } from './day-load'
import { round2 } from './load'
import type { BenchProvider } from './provider'
import { BENCH_METRICS_TOKEN, startService } from './service'

/** The service's purge, run back to back (PURGE_INTERVAL_MS's least value), or never in the run. */
export const PURGE_EVERY_MS = '100'
const PURGE_NEVER_MS = '86400000'

export interface RoundSpec {
  readonly url: string
  readonly provider: BenchProvider
  readonly tool: LoadTool
  readonly connections: number
  readonly warmupSeconds: number
  readonly seconds: number
  /** Unique in the run: the round's customer and key prefix carry it. */
  readonly tag: string
  /** Run the service's own retention purge during the round (PURGE_INTERVAL_MS=100). */
  readonly purge: boolean
  readonly retentionSeconds: number
  /** Work started beside the measured seconds (another purge, a candidate's): stop() says how many keys it deleted. */
  readonly beside?: (() => { stop(): Promise<number> }) | undefined
  /** The checkout whose service runs (another worktree, for an A/B). @default this one */
  readonly cwd?: string | undefined
}

export interface ExactlyOnce {
  readonly payments: number
  readonly charges: number
  readonly ok: boolean
}

export interface RoundResult {
  readonly load: FreshLoad
  /** pg_stat_user_tables.seq_scan of idempotency_keys, from before the service started to after its backends left. */
  readonly seqScans: number
  /** Keys the service's purge deleted during the measured seconds (its idempotency_purged_keys_total), and per second. */
  readonly purged: number
  readonly purgedPerSecond: number
  /** Keys past retention still in the table after the round. */
  readonly expiredLeft: number
  readonly exactlyOnce: ExactlyOnce
}

export async function runDayRound(spec: RoundSpec): Promise<RoundResult> {
  const sql = postgres(spec.url, { max: 1, onnotice: () => undefined })
  const customer = `cus_day_${spec.tag}`
  try {
    const seqBefore = await seqScans(sql)
    const service = await startService(spec.url, spec.provider.url, {
      PURGE_INTERVAL_MS: spec.purge ? PURGE_EVERY_MS : PURGE_NEVER_MS,
      IDEMPOTENCY_RETENTION_SECONDS: String(spec.retentionSeconds),
    }, [], spec.cwd)
    let load: FreshLoad
    let purged = 0
    try {
      const options = { url: service.url, connections: spec.connections, customer }
      if (spec.warmupSeconds > 0) await freshLoad(spec.tool, { ...options, seconds: spec.warmupSeconds, prefix: `${spec.tag}-w-` })
      const purgedBefore = await purgedKeys(service.url)
      let purgedAfter = purgedBefore
      const beside = spec.beside?.()
      try {
        load = await freshLoad(spec.tool, { ...options, seconds: spec.seconds, prefix: `${spec.tag}-f-` })
        // Read as the measured seconds end: stopping what ran beside can take seconds, while this purge goes on.
        purgedAfter = await purgedKeys(service.url)
      } finally {
        purged = (await beside?.stop()) ?? 0
      }
      purged += purgedAfter - purgedBefore
    } finally {
      await service.stop()
    }
    if (load.failed > 0) throw new Error(`round ${spec.tag}: ${load.failed} of ${load.requests} answers failed:\n${service.output().slice(-2000)}`)
    await backendsGone(sql, spec.url)
    const seqAfter = await seqScans(sql)
    const seconds = load.requests / Math.max(load.rps, 1e-9)
    return {
      load,
      seqScans: seqAfter - seqBefore,
      purged,
      purgedPerSecond: Math.round(purged / seconds),
      expiredLeft: await expiredKeys(sql, spec.retentionSeconds),
      exactlyOnce: await countOnce(sql, spec.provider.url, customer),
    }
  } finally {
    await sql.end()
  }
}

/**
 * How the key table is frozen: `manual`, `VACUUM (FREEZE)` as an operator types it (unthrottled, every row
 * frozen); `autovacuum`, what PostgreSQL's anti-wraparound autovacuum does to it: an aggressive VACUUM (every
 * page not yet all-frozen is read) throttled as autovacuum is by default (2 ms after each 200 cost units), that
 * freezes only rows older than vacuum_freeze_min_age (50 M transactions). Keys live for the retention (a day),
 * so in production that vacuum reads the table and freezes next to nothing.
 */
export type FreezeAs = 'manual' | 'autovacuum'
export const FREEZE_AS: readonly FreezeAs[] = ['manual', 'autovacuum']

export type FreezeSpec = Omit<RoundSpec, 'purge'> & { readonly as: FreezeAs }

export interface FreezeResult {
  /** Absent in runs before it was a choice: manual. */
  readonly as?: FreezeAs
  readonly vacuumSeconds: number
  /** One window of load just before the VACUUM, on the same service. */
  readonly before: FreshLoad
  /** The windows of load while it ran. */
  readonly during: readonly FreshLoad[]
  /** Beside each window of `during`: the vacuum's phases seen in it (pg_stat_progress_vacuum, sampled each 500 ms), and whether a checkpoint ended in it. */
  readonly windows?: readonly FreezeWindow[]
  /** age(relfrozenxid) of the key table before and after: what anti-wraparound vacuum counts towards. */
  readonly frozenXidAge: { readonly before: number; readonly after: number }
  readonly exactlyOnce: ExactlyOnce
}

export interface FreezeWindow {
  readonly phases: readonly string[]
  readonly checkpoint: boolean
}

/** What the vacuum is doing, sampled beside the load so that a slow window can be put down to a phase (or a checkpoint). */
function sampleVacuum(sql: postgres.Sql): { stop(): Promise<void>; windowOf(from: number, to: number): FreezeWindow } {
  const samples: { at: number; phase: string | null; checkpointAt: string }[] = []
  let stopped = false
  const loop = (async () => {
    while (!stopped) {
      const [row] = await sql<{ phase: string | null; checkpoint_at: string }[]>`
        select (select phase from pg_stat_progress_vacuum where relid = 'idempotency_keys'::regclass) as phase,
               (pg_control_checkpoint()).checkpoint_time::text as checkpoint_at`
      samples.push({ at: performance.now(), phase: row!.phase, checkpointAt: row!.checkpoint_at })
      await Bun.sleep(500) // a sampling period, not a wait for an event
    }
  })()
  return {
    async stop() {
      stopped = true
      await loop
    },
    windowOf(from, to) {
      const inside = samples.filter((x) => x.at >= from && x.at <= to)
      const before = samples.filter((x) => x.at < from).at(-1) ?? inside[0]
      return {
        phases: [...new Set(inside.map((x) => x.phase).filter((x): x is string => x !== null))],
        checkpoint: inside.some((x) => x.checkpointAt !== before?.checkpointAt),
      }
    },
  }
}

/** One VACUUM of idempotency_keys that freezes it (`spec.as`) while fresh payments run at full speed, in windows of `seconds`. */
export async function runFreeze(spec: FreezeSpec): Promise<FreezeResult> {
  const sql = postgres(spec.url, { max: 1, onnotice: () => undefined })
  const vacuum = postgres(spec.url, { max: 1, onnotice: () => undefined })
  const customer = `cus_day_${spec.tag}`
  try {
    const ageBefore = await frozenXidAge(sql)
    const service = await startService(spec.url, spec.provider.url, { PURGE_INTERVAL_MS: PURGE_NEVER_MS, IDEMPOTENCY_RETENTION_SECONDS: String(spec.retentionSeconds) })
    const during: FreshLoad[] = []
    const spans: [number, number][] = []
    let windows: FreezeWindow[] = []
    let before: FreshLoad
    let vacuumSeconds = 0
    try {
      const options = { url: service.url, connections: spec.connections, customer }
      if (spec.warmupSeconds > 0) await freshLoad(spec.tool, { ...options, seconds: spec.warmupSeconds, prefix: `${spec.tag}-w-` })
      before = await freshLoad(spec.tool, { ...options, seconds: spec.seconds, prefix: `${spec.tag}-b-` })
      if (spec.as === 'autovacuum') {
        await vacuum`set vacuum_freeze_table_age = 0`
        await vacuum`set vacuum_cost_delay = '2ms'`
        await vacuum`set vacuum_cost_limit = 200`
      }
      const sampler = sampleVacuum(sql)
      const started = performance.now()
      let running = true
      const frozen = (spec.as === 'autovacuum' ? vacuum`vacuum idempotency_keys` : vacuum`vacuum (freeze) idempotency_keys`).then(() => { vacuumSeconds = (performance.now() - started) / 1000 }).finally(() => { running = false })
      try {
        for (let window = 0; window === 0 || running; window++) {
          const from = performance.now()
          during.push(await freshLoad(spec.tool, { ...options, seconds: spec.seconds, prefix: `${spec.tag}-v${window}-` }))
          spans.push([from, performance.now()])
        }
      } finally {
        await frozen
        await sampler.stop()
      }
      windows = spans.map(([from, to]) => sampler.windowOf(from, to))
    } finally {
      await service.stop()
    }
    const failed = [before, ...during].reduce((sum, w) => sum + w.failed, 0)
    if (failed > 0) throw new Error(`VACUUM (FREEZE) round: ${failed} answers failed:\n${service.output().slice(-2000)}`)
    return {
      as: spec.as,
      vacuumSeconds: round2(vacuumSeconds),
      before,
      during,
      windows,
      frozenXidAge: { before: ageBefore, after: await frozenXidAge(sql) },
      exactlyOnce: await countOnce(sql, spec.provider.url, customer),
    }
  } finally {
    await vacuum.end()
    await sql.end()
  }
}

async function seqScans(sql: postgres.Sql): Promise<number> {
  await sql`select pg_stat_clear_snapshot()`
  const [row] = await sql<{ n: number }[]>`select seq_scan::int as n from pg_stat_user_tables where relname = 'idempotency_keys'`
  return row?.n ?? 0
}

/** The service's backends have exited, so their counters are in pg_stat_user_tables. */
async function backendsGone(sql: postgres.Sql, url: string): Promise<void> {
  const database = new URL(url).pathname.slice(1)
  await waitFor(async () => {
    const [row] = await sql<{ n: number }[]>`select count(*)::int as n from pg_stat_activity where datname = ${database} and pid <> pg_backend_pid()`
    return row?.n === 0
  }, `the service's backends on ${database} to exit`, 30_000)
}

/** Keys past retention by their created_at (the purge's range: an index range, no sequential scan). */
export async function expiredKeys(sql: postgres.Sql, retentionSeconds: number): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    select count(*)::int as n from idempotency_keys where created_at <= now() - make_interval(secs => ${retentionSeconds})`
  return row?.n ?? 0
}

export async function purgedKeys(serviceUrl: string): Promise<number> {
  const response = await fetch(`${serviceUrl}/metrics`, { headers: { authorization: `Bearer ${BENCH_METRICS_TOKEN}` } })
  if (response.status !== 200) throw new Error(`/metrics answered ${response.status}`)
  return (await response.text()).split('\n')
    .filter((line) => line.startsWith('idempotency_purged_keys_total'))
    .reduce((sum, line) => sum + Number(line.split(' ').at(-1)), 0)
}

async function frozenXidAge(sql: postgres.Sql): Promise<number> {
  const [row] = await sql<{ age: number }[]>`select age(relfrozenxid)::int as age from pg_class where oid = 'idempotency_keys'::regclass`
  return row?.age ?? 0
}

/** Every payment of the customer has its own charge at the provider, and the provider charged nothing else for it. */
async function countOnce(sql: postgres.Sql, providerUrl: string, customer: string): Promise<ExactlyOnce> {
  const rows = await sql<{ ref: string }[]>`select provider_ref as ref from payments where customer = ${customer}`
  const charges = new Set((await chargesAt(providerUrl, customer)).map((charge) => charge.id))
  const refs = new Set(rows.map((row) => row.ref))
  const ok = refs.size === rows.length && rows.length === charges.size && [...refs].every((ref) => charges.has(ref))
  return { payments: rows.length, charges: charges.size, ok }
}
