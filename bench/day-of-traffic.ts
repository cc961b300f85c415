/**
 * A day of traffic on one node (issue 40): `npm run bench:day`.
 *
 *   bun bench/day-of-traffic.ts [--keys 10000000] [--expired 0.1] [--rounds 5] [--seconds 10] [--warmup 5]
 *                               [--connections 32] [--calibrate 4000] [--load wrk|autocannon] [--key-form new|old] [--json file] [--keep] [--skip-freeze]
 *   bun bench/day-of-traffic.ts --database idem_day_xxxx --previous that-run.json [--skip-freeze] [...]   (rounds again on a kept table)
 *
 * 1. A fresh database `idem_day_*` on DATABASE_URL's server, migrated; the
 *    service's app completes `--calibrate` payments on it, 32 at a time (their
 *    bytes per key: bench/key-bytes.ts's measure), and the key table is seeded
 *    from its newest key up to `--keys` (bench/day-seed.ts: a share past
 *    retention, a few processing), then VACUUM (ANALYZE): the seeding time and
 *    the bytes per key there.
 * 2. Rounds, interleaved (odd rounds in one order, even rounds reversed), each
 *    a freshly started service (bench/service.ts) charging the same provider
 *    process, `--warmup` s of fresh payments then `--seconds` s measured:
 *    - `large`: on the seeded table, its purge off;
 *    - `empty`: on a fresh copy of the migrated, empty database;
 *    - `purge`: on the seeded table, the service's own retention purge running
 *      back to back (PURGE_INTERVAL_MS=100: src/maintenance/retention-purge.ts
 *      in the service's process, batches of 500, each followed by a pause three times its own time:
 *      a quarter of a connection, the service being the one live process).
 *    Per round: payments/s, p50, p99, sequential scans on idempotency_keys
 *    (service start to its backends' exit), keys purged, and exactly once for
 *    the round's customer (its payments in the table, its charges at the provider).
 * 3. One VACUUM (FREEZE) of idempotency_keys while the load runs, in windows
 *    of `--seconds`: its duration, and p99 beside it against the window before.
 *
 * Prints Markdown, writes the figures as JSON (--json, default .data/day-last.json);
 * drops its databases unless --keep.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { dirname } from 'node:path'
import { cpus, loadavg } from 'node:os'
import { parseArgs } from 'node:util'
import postgres from 'postgres'
import { openPools } from '../src/store/db'
import { migrateService } from '../src/store/migrate'
import { startApp } from '../test/support/app'
import type { TestDatabase } from '../test/support/db'
import { defaultLoadTool, type LoadTool } from './day-load'
import { dayReport, type DayResults } from './day-report'
import { FREEZE_AS, runDayRound, runFreeze, type FreezeAs, type FreezeResult, type RoundResult } from './day-rounds'
import { purgePlan } from './day-purge-plan'
import { fillfactorFor, seedDay, type DaySeed } from './day-seed'
import { keyBytes, pay, settledKeyBytes, type KeyBytes } from './key-bytes'
import { round2 } from './load'
import { startProvider, type BenchProvider } from './provider'

/** The service's default retention: a day of traffic is what it keeps. */
const RETENTION_SECONDS = 86_400
/** In-flight and stranded keys are few (bench/seed.ts's figure). */
const SEEDED_PROCESSING = 1_000

export type Cell = 'large' | 'empty' | 'purge'
const CELLS: readonly Cell[] = ['large', 'empty', 'purge']

const { values } = parseArgs({
  options: {
    keys: { type: 'string', default: '10000000' },
    expired: { type: 'string', default: '0.1' },
    rounds: { type: 'string', default: '5' },
    seconds: { type: 'string', default: '10' },
    warmup: { type: 'string', default: '5' },
    connections: { type: 'string', default: '32' },
    calibrate: { type: 'string', default: '4000' },
    load: { type: 'string' },
    json: { type: 'string', default: '.data/day-last.json' },
    /** A database a run kept (--keep), instead of seeding one: rounds again on it. */
    database: { type: 'string' },
    /** That run's JSON: its calibration and seed figures (and its VACUUM's, with --skip-freeze). */
    previous: { type: 'string' },
    'skip-freeze': { type: 'boolean', default: false },
    /** How the key table is frozen (day-rounds.ts FreezeAs), one or both in order: `autovacuum,manual` runs both on the one table (the first freezes next to nothing). */
    'freeze-as': { type: 'string', default: 'manual' },
    /** The cells to run, e.g. `large,empty` (all three by default). */
    cells: { type: 'string', default: CELLS.join(',') },
    keep: { type: 'boolean', default: false },
    'key-form': { type: 'string', default: 'new' },
  },
})
const number = (name: keyof typeof values) => {
  const value = Number(values[name])
  if (!Number.isFinite(value) || value < 0) throw new Error(`--${name} must be a number >= 0, got ${values[name]}`)
  return value
}
const settings = {
  keys: number('keys'), expiredShare: number('expired'), rounds: Math.max(1, number('rounds')), seconds: number('seconds'),
  warmupSeconds: number('warmup'), connections: number('connections'), calibrate: Math.max(1, number('calibrate')),
  tool: (values.load ?? defaultLoadTool()) as LoadTool, retentionSeconds: RETENTION_SECONDS,
}
const freezeAs = values['freeze-as']!.split(',').map((a) => a.trim()) as FreezeAs[]
if (freezeAs.length === 0 || freezeAs.some((a) => !FREEZE_AS.includes(a)) || new Set(freezeAs).size !== freezeAs.length) throw new Error(`--freeze-as must name ${FREEZE_AS.join(' or ')}, or both, got ${values['freeze-as']}`)
const cells = values.cells!.split(',').map((c) => c.trim()) as Cell[]
if (cells.length === 0 || cells.some((c) => !CELLS.includes(c))) throw new Error(`--cells must name some of ${CELLS.join(', ')}, got ${values.cells}`)
if (settings.tool !== 'wrk' && settings.tool !== 'autocannon') throw new Error(`--load must be wrk or autocannon, got ${settings.tool}`)

if (values['key-form'] !== 'old' && values['key-form'] !== 'new') throw new Error(`--key-form must be old or new, got ${values['key-form']}`)

/**
 * `--key-form`: the form keys are claimed in (sql/engine/00020). `new`, as a
 * migrated database's since the contract step 00023, the key table filled
 * whole; `old`, as a database whose switch waits for an older release's
 * processes, the key table filled to the payments' 35 % (test/support/db.ts
 * setKeyForm).
 */
async function keyForm(url: string): Promise<void> {
  const form = values['key-form']
  const sql = postgres(url, { max: 1, onnotice: () => undefined })
  try {
    await sql`update idempotency_key_form set form = ${form!} where id = 1`
    await sql.unsafe(`alter table idempotency_keys set (fillfactor = ${form === 'old' ? 35 : 100})`)
  } finally {
    await sql.end()
  }
}

const load1 = () => round2(loadavg()[0]!)
const log = (line: string) => console.error(`[day ${new Date().toISOString().slice(11, 19)} load ${load1()}] ${line}`)

async function main(): Promise<void> {
  const base = process.env.DATABASE_URL
  if (!base) throw new Error('DATABASE_URL is not set: the day of traffic runs on that server')
  const runStarted = performance.now()
  const loadBefore = load1()
  const id = crypto.randomUUID().slice(0, 8)
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  const urlOf = (name: string) => Object.assign(new URL(base), { pathname: `/${name}` }).toString()
  const made: string[] = []
  const create = async (name: string, template?: string) => {
    await admin.unsafe(`create database "${name}"${template ? ` template "${template}"` : ''}`)
    made.push(name)
    return urlOf(name)
  }
  const drop = async (name: string) => {
    await admin.unsafe(`drop database if exists "${name}" with (force)`)
    made.splice(made.indexOf(name), 1)
  }
  let provider: BenchProvider | undefined
  try {
    const [server] = await admin<{ version: string }[]>`select current_setting('server_version') as version`
    const version = server?.version ?? 'unknown'
    const previous = values.previous ? (JSON.parse(readFileSync(values.previous, 'utf8')) as DayResults) : undefined
    const reused = values.database
    if (reused && !previous) throw new Error('--database needs --previous: the JSON of the run that seeded it (its calibration and seed figures)')
    const largeName = reused ?? `idem_day_${id}`
    const large = reused ? urlOf(reused) : await create(largeName)
    const sql = postgres(large, { max: 1, onnotice: () => undefined })
    let inUse: KeyBytes
    let seed: DaySeed
    if (previous) {
      log(`reusing ${largeName}, seeded by the run of ${previous.at}`)
      inUse = previous.inUse
      seed = previous.seed
    } else {
      await migrateService(large)
      await keyForm(large)
      log(`${settings.calibrate} payments through the service's app, 32 at a time (the row every seeded key copies)`)
      const pools = openPools(large, { applicationName: 'day-calibrate', shortMax: 8, workMax: 8 })
      const app = await startApp({ url: large, pools, sql, drop: async () => undefined } satisfies TestDatabase)
      try {
        await pay(app, settings.calibrate, 32)
      } finally {
        await app.stop()
        await pools.close(1)
      }
      inUse = await settledKeyBytes(sql, settings.calibrate)
      const fillfactor = fillfactorFor(inUse.rowsPerPage, inUse.avgRow)
      log(`in use: ${Math.round(inUse.perKey)} B per key, ${inUse.rowsPerPage.toFixed(1)} rows per page of ${Math.round(inUse.avgRow)} B: seeding at fillfactor ${fillfactor}`)

      log(`seeding ${settings.keys.toLocaleString('en')} keys (${settings.expiredShare * 100} % past retention, ${SEEDED_PROCESSING} processing)`)
      seed = await seedDay(sql, { keys: settings.keys, expiredShare: settings.expiredShare, processing: SEEDED_PROCESSING, retentionSeconds: RETENTION_SECONDS, fillfactor }, log)
      log(`seeded in ${seed.seconds.toFixed(1)} s, VACUUM (ANALYZE) ${seed.vacuumSeconds.toFixed(1)} s; measuring bytes per key`)
    }
    await admin`checkpoint`
    const seeded = await keyBytes(sql)
    log(`${seeded.keys.toLocaleString('en')} keys: ${Math.round(seeded.perKey)} B per completed key`)
    await sql.end()

    const emptyTemplate = `idem_day_${id}_empty`
    const empty = await create(emptyTemplate)
    await migrateService(empty)
    await keyForm(empty)
    provider = await startProvider(0)

    const rounds: Record<Cell, RoundResult[]> = { large: [], empty: [], purge: [] }
    const roundLoads: number[] = []
    for (let round = 1; round <= settings.rounds; round++) {
      roundLoads.push(load1())
      for (const cell of round % 2 === 1 ? cells : [...cells].reverse()) {
        const tag = `${id}_${round}${cell[0]}`
        const emptyName = `idem_day_${id}_e${round}`
        const url = cell === 'empty' ? await create(emptyName, emptyTemplate) : large
        // Every round starts with the server at rest: the seed's (or a copy's) pages written back, not beside its commits.
        await admin`checkpoint`
        try {
          const result = await runDayRound({ url, provider, tool: settings.tool, connections: settings.connections, warmupSeconds: settings.warmupSeconds, seconds: settings.seconds, tag, purge: cell === 'purge', retentionSeconds: RETENTION_SECONDS })
          rounds[cell].push(result)
          log(`round ${round} ${cell}: ${Math.round(result.load.rps)}/s, p50 ${result.load.p50} ms, p99 ${result.load.p99} ms, ${result.seqScans} seq scans${cell === 'purge' ? `, purged ${result.purgedPerSecond}/s (${result.expiredLeft.toLocaleString('en')} past retention left)` : ''}; exactly once ${result.exactlyOnce.ok ? 'holds' : 'BROKEN'} (${result.exactlyOnce.payments} payments, ${result.exactlyOnce.charges} charges)`)
        } finally {
          if (cell === 'empty') await drop(emptyName)
        }
      }
    }

    log('the purge\'s statement on the seeded table, idle: batch times and its plan')
    const purge = previous && !cells.includes('purge') ? previous.purge : await purgePlan(large, RETENTION_SECONDS)
    log(`purge batch p50 ${purge.batchP50Ms} ms idle: at most ${purge.pacedCeiling}/s with the ${purge.pauseMs} ms pause`)
    await admin`checkpoint`

    const freezeLoad = load1()
    // --skip-freeze: the figures of the run named by --previous, or none.
    const skipFreeze = values['skip-freeze'] ?? false
    if (skipFreeze) log(previous ? `VACUUM (FREEZE): the figures of the run of ${previous.at} (--skip-freeze)` : 'VACUUM (FREEZE): not run (--skip-freeze)')
    const freezes: FreezeResult[] = skipFreeze ? previous?.freezes ?? (previous?.freeze ? [previous.freeze] : []) : []
    for (const as of skipFreeze ? [] : freezeAs) {
      log(`one ${as === 'manual' ? 'VACUUM (FREEZE)' : 'aggressive, throttled VACUUM (as anti-wraparound autovacuum)'} of idempotency_keys under the same load`)
      const freeze = await runFreeze({ url: large, provider, tool: settings.tool, connections: settings.connections, warmupSeconds: settings.warmupSeconds, seconds: settings.seconds, tag: `${id}_freeze_${as}`, retentionSeconds: RETENTION_SECONDS, as })
      log(`${as}: took ${freeze.vacuumSeconds} s; p99 ${freeze.before.p99} ms before, ${freeze.during.map((w) => w.p99).join(', ')} ms during; age(relfrozenxid) ${freeze.frozenXidAge.before} -> ${freeze.frozenXidAge.after}`)
      freezes.push(freeze)
    }

    const results: DayResults = {
      at: new Date().toISOString(),
      machine: { nproc: cpus().length, cpu: cpus()[0]?.model ?? 'unknown', postgres: version, bun: Bun.version, loadBefore, loadAfter: load1(), roundLoads, freezeLoad },
      settings: { ...settings, processing: SEEDED_PROCESSING },
      inUse,
      seed,
      seeded,
      rounds,
      purge,
      freezes,
      totalSeconds: Math.round((performance.now() - runStarted) / 1000),
    }
    mkdirSync(dirname(values.json!), { recursive: true })
    writeFileSync(values.json!, JSON.stringify(results, null, 2))
    console.log(dayReport(results))
    if (values.keep && !reused) {
      made.splice(made.indexOf(largeName), 1)
      log(`kept: ${large}`)
    }
  } finally {
    await provider?.stop().catch(() => undefined)
    for (const name of [...made].reverse()) await drop(name).catch((error: unknown) => log(`could not drop ${name}: ${String(error)}`))
    await admin.end()
  }
}

await main()
