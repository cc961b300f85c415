/**
 * `npm run bench`: one run, all figures, written down as ratios of that run.
 *
 * 1. Wire counts: database statements, round trips and transactions per
 *    request, counted by a proxy in front of the service's database (and of
 *    the naive app's), one request at a time and 32 at a time.
 * 2. The service against the naive app (bench/naive-app.ts: seed 002's
 *    check-then-insert as an app of its own), as a user compares them
 *    (bench/versus-naive.ts): every round on a fresh database and a freshly
 *    started process, `wrk` as the load, the same provider process for both.
 *    Cells: an instant provider at 32 connections (fresh payments, and
 *    replays of completed keys); a 200 ms provider at 256 connections, quiet
 *    and with one core kept busy by stress-ng; fresh payments on a table of
 *    1,000,000 keys. Rounds are interleaved (each round runs every cell, in
 *    alternating order) and every figure is the median of its rounds.
 * 3. 409s: retries of one in-flight key, 300 at once and 32 at a time.
 * 4. /metrics scrape time with 1M keys in the table, and the purge rate.
 *
 * Exactly once is counted at both ends in every service round: its payments
 * in the table, its charges in the provider's ledger. Results are printed as
 * Markdown and saved to .data/bench-last.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs'
import { cpus, loadavg } from 'node:os'
import postgres from 'postgres'
import { citusBin } from '../test/support/citus'
import { citusReport, runCitusRound } from './citus'
import { measureCpu } from './cpu'
import { runLoad, round2, type LoadResult } from './load'
import { timePurge, timeScrapes } from './maintenance'
import { startHoldingProvider, startProvider, type BenchProvider } from './provider'
import { report, type Cell, type CellResult, type Results } from './report'
import { measureRoundTrips } from './round-trips'
import { seedKeys } from './seed'
import { openBenchServer, type BenchServer } from './server'
import { BENCH_API_KEY, startService, type Service } from './service'
import { keyRunElsewhere, keyRunHere, runStorm, STORM_CONNECTIONS, STORM_WAVES, type Load } from './storm'
import { startStress, stressAvailable, STRESS_COMMAND, STRESS_INSTALL_HINT, type Stress } from './stress'
import { median, runRound, WARMUP_SECONDS, type RoundResult } from './versus-naive'
import { wrkAvailable, WRK_INSTALL_HINT } from './wrk'

const setting = (name: string, fallback: number) => {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number >= 0, got ${raw}`)
  return value
}

export const SETTINGS = Object.freeze({
  /** Measured seconds of each round. */
  roundSeconds: setting('BENCH_ROUND_SECONDS', 5),
  /** Unmeasured seconds of load before each round's measured ones (bench/versus-naive.ts: the JIT settles). */
  warmupSeconds: WARMUP_SECONDS,
  /** Rounds of every cell; each figure is their median. */
  rounds: setting('BENCH_ROUNDS', 3),
  /** Instant provider: twice the service's 16 database connections, so it is never idle (issue 25's figure). */
  connections: setting('BENCH_CONNECTIONS', 32),
  /** Slow provider: hundreds of clients waiting on a real provider at once. */
  slowConnections: setting('BENCH_SLOW_CONNECTIONS', 256),
  /** A real provider's fast answer: card networks take 200 to 2,000 ms. */
  slowProviderMs: setting('BENCH_SLOW_PROVIDER_MS', 200),
  /** 1: the slow cells run again with `stress-ng --cpu 1` (when installed); 0 skips that. */
  stress: setting('BENCH_STRESS', 1),
  /** Concurrent requests of the wire count's second part. */
  roundTripConnections: setting('BENCH_RT_CONNECTIONS', 32),
  /** Fresh requests counted at that concurrency. */
  roundTripRequests: setting('BENCH_RT_REQUESTS', 2000),
  /** Keys of the large table (fresh payments on it, the scrape, the purge); 0 skips those. */
  seedKeys: setting('BENCH_SEED_KEYS', 1_000_000),
  /** 1: the Citus round (bench/citus.ts) when a PostgreSQL with citus is installed; 0 skips it. */
  citus: setting('BENCH_CITUS', 1),
})

const load1 = () => round2(loadavg()[0]!)
const log = (line: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)} load ${load1()}] ${line}`)
const headers = { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json' }

async function main(): Promise<void> {
  if (!wrkAvailable()) throw new Error(`npm run bench needs wrk: ${WRK_INSTALL_HINT}`)
  const runStarted = performance.now()
  const loadBefore = load1()
  const server = await openBenchServer(log)
  log(`PostgreSQL ${server.version} at ${server.base.replace(/\/\/[^@]*@/, '//')} (${server.private ? 'the bench\'s own cluster: all its processes are counted' : 'DATABASE_URL\'s server: the run\'s backends are counted'}; pg_stat_statements ${server.statements ? 'loaded' : 'not loaded'})`)
  const providers: BenchProvider[] = []
  const services: Service[] = []
  const stresses: Stress[] = []
  try {
    const template = await server.template(`idem_bench_template_${crypto.randomUUID().slice(0, 6)}`)
    const instant = await startProvider(0)
    providers.push(instant)
    const slow = await startProvider(SETTINGS.slowProviderMs)
    providers.push(slow)

    log(`wire counts: statements and round trips per request, one at a time and ${SETTINGS.roundTripConnections} at a time`)
    const wireDb = await server.create(`idem_bench_wire_${crypto.randomUUID().slice(0, 6)}`, template)
    const roundTrips = await measureRoundTrips(wireDb, instant.url, { connections: SETTINGS.roundTripConnections, requests: SETTINGS.roundTripRequests })

    let large: string | undefined
    if (SETTINGS.seedKeys > 0) {
      log(`seeding ${SETTINGS.seedKeys.toLocaleString('en')} keys into a template (bench/seed.ts), analyzed`)
      large = await server.template(`${template}_seeded`, (sql) => seedKeys(sql, SETTINGS.seedKeys))
    }

    const busy = SETTINGS.stress !== 0 && stressAvailable()
    const stressNote = SETTINGS.stress === 0 ? 'skipped (BENCH_STRESS=0)' : busy ? `\`${STRESS_COMMAND.join(' ')}\` during the "busy" cells` : `skipped: stress-ng is not installed (${STRESS_INSTALL_HINT})`
    const cells: Cell[] = [
      { name: 'instant fresh', side: 'service', kind: 'fresh', provider: 'instant', connections: SETTINGS.connections, condition: 'quiet', table: 'empty' },
      { name: 'instant fresh, naive', side: 'naive', kind: 'fresh', provider: 'instant', connections: SETTINGS.connections, condition: 'quiet', table: 'empty' },
      { name: 'instant replay', side: 'service', kind: 'replay', provider: 'instant', connections: SETTINGS.connections, condition: 'quiet', table: 'empty' },
      { name: 'instant replay, naive', side: 'naive', kind: 'replay', provider: 'instant', connections: SETTINGS.connections, condition: 'quiet', table: 'empty' },
      { name: 'slow fresh', side: 'service', kind: 'fresh', provider: 'slow', connections: SETTINGS.slowConnections, condition: 'quiet', table: 'empty' },
      { name: 'slow fresh, naive', side: 'naive', kind: 'fresh', provider: 'slow', connections: SETTINGS.slowConnections, condition: 'quiet', table: 'empty' },
      ...(busy ? [
        { name: 'slow fresh, busy', side: 'service', kind: 'fresh', provider: 'slow', connections: SETTINGS.slowConnections, condition: 'busy', table: 'empty' },
        { name: 'slow fresh, naive, busy', side: 'naive', kind: 'fresh', provider: 'slow', connections: SETTINGS.slowConnections, condition: 'busy', table: 'empty' },
      ] satisfies Cell[] : []),
      ...(large ? [{ name: 'instant fresh, 1M keys', side: 'service', kind: 'fresh', provider: 'instant', connections: SETTINGS.connections, condition: 'quiet', table: 'large' }] satisfies Cell[] : []),
    ]
    log(`${cells.length} cells × ${SETTINGS.rounds} rounds of ${SETTINGS.roundSeconds} s, each on a fresh database and a freshly started process; one core busy: ${stressNote}`)
    const byCell = new Map<string, RoundResult[]>(cells.map((cell) => [cell.name, []]))
    for (let round = 1; round <= SETTINGS.rounds; round++) {
      const order = round % 2 === 1 ? cells : [...cells].reverse()
      for (const cell of order) {
        const stress = cell.condition === 'busy' ? await startStress(SETTINGS.roundSeconds * 4 + 60) : undefined
        if (stress) stresses.push(stress)
        try {
          const result = await runRound(server, {
            side: cell.side, kind: cell.kind, provider: cell.provider === 'slow' ? slow : instant, connections: cell.connections,
            seconds: SETTINGS.roundSeconds, template: cell.table === 'large' ? large! : template, tag: `r${round}${cells.indexOf(cell)}`,
          })
          byCell.get(cell.name)!.push(result)
          log(`round ${round} ${cell.name}: ${Math.round(result.load.rps)}/s, p50 ${result.load.p50} ms, CPU µs per answer ${result.cpuUs.process} + PostgreSQL ${result.cpuUs.postgres}; machine ${result.machine.busyPercent}% busy${cell.side === 'service' ? `; exactly once ${result.exactlyOnce.ok ? 'holds' : 'BROKEN'}` : ''}`)
        } finally {
          if (stress) {
            stresses.splice(stresses.indexOf(stress), 1)
            await stress.stop()
          }
        }
      }
    }
    const versus: CellResult[] = cells.map((cell) => summarizeCell(cell, byCell.get(cell.name)!))

    // The 409 storms' service charges through a provider that holds its one charge (the key it runs itself).
    const stormDb = await server.create(`idem_bench_storm_${crypto.randomUUID().slice(0, 6)}`, template)
    const sql = postgres(stormDb, { max: 2, onnotice: () => undefined })
    const holding = startHoldingProvider()
    const after = await startService(stormDb, holding.url, { METRICS_CACHE_MS: '0' })
    services.push(after)
    const stormLoad: Load = (path, request, extra) => runLoad({
      url: `${after.url}${path}`, connections: extra.connections ?? SETTINGS.connections, headers, request,
      ...(extra.amount !== undefined ? { amount: extra.amount } : { durationS: extra.durationS ?? SETTINGS.roundSeconds }),
    })
    const database = new URL(stormDb).pathname.slice(1)
    const moderate = {
      connections: SETTINGS.connections,
      seconds: SETTINGS.roundSeconds,
      measure: (work: () => Promise<LoadResult>) => measureCpu(sql, database, { service: after.proc.pid, provider: instant.pid }, work),
    }
    log(`409s of a key another process runs: ${STORM_CONNECTIONS} concurrent retries, ${STORM_WAVES} waves, then ${SETTINGS.connections} at a time for ${SETTINGS.roundSeconds} s`)
    const stormLoadBefore = load1()
    const storm = await runStorm(after.url, stormLoad, await keyRunElsewhere(sql), moderate)
    const stormLoadAverage = { min: Math.min(stormLoadBefore, load1()), max: Math.max(stormLoadBefore, load1()) }
    log('409s of a key this service runs itself (its request held at the provider): the same three phases')
    const ownLoadBefore = load1()
    const here = await keyRunHere(sql, after.url, headers)
    const stormHere = await runStorm(after.url, stormLoad, here, moderate)
    const ownLoadAverage = { min: Math.min(ownLoadBefore, load1()), max: Math.max(ownLoadBefore, load1()) }
    holding.release()
    const heldAnswer = await here.answered
    if (heldAnswer !== 502) throw new Error(`the held request answered ${heldAnswer}, not 502 (refused by the holding provider)`)
    holding.stop()
    await stopService(after, services)
    await sql.end()

    const maintenance = large ? await timeMaintenance(server, large, instant, services) : undefined
    const citus = SETTINGS.citus && citusBin()
      ? await runCitusRound({ rounds: SETTINGS.rounds, seconds: SETTINGS.roundSeconds, connections: SETTINGS.connections, log })
      : undefined
    if (!citus) log(SETTINGS.citus ? 'the Citus round skipped: no PostgreSQL with citus.so (bash ../shared/citus/build.sh installs it)' : 'the Citus round skipped (BENCH_CITUS=0)')

    const results: Results = {
      at: new Date().toISOString(),
      machine: { nproc: cpus().length, cpu: cpus()[0]?.model ?? 'unknown', postgres: server.version, privateCluster: server.private, bun: Bun.version, os: `${process.platform} ${process.arch}`, loadBefore, loadAfter: load1() },
      settings: { ...SETTINGS, stormConnections: STORM_CONNECTIONS, stormWaves: STORM_WAVES },
      stressNote,
      versus,
      roundTrips,
      storm: { ...storm, loadAverage: stormLoadAverage },
      stormHere: { ...stormHere, loadAverage: ownLoadAverage },
      scrape: maintenance?.scrape,
      purge: maintenance?.purge,
      totalSeconds: Math.round((performance.now() - runStarted) / 1000),
    }
    mkdirSync('.data', { recursive: true })
    writeFileSync('.data/bench-last.json', JSON.stringify(results, null, 2))
    console.log(report(results))
    if (citus) {
      writeFileSync('.data/bench-citus-last.json', JSON.stringify(citus, null, 2))
      console.log(citusReport(citus))
    }
  } finally {
    for (const stress of stresses.splice(0)) await stress.stop().catch(() => undefined)
    for (const service of services.splice(0)) await service.stop().catch(() => undefined)
    for (const provider of providers.splice(0)) await provider.stop().catch(() => undefined)
    await server.stop()
  }
}

async function stopService(service: Service, services: Service[]): Promise<void> {
  services.splice(services.indexOf(service), 1)
  await service.stop()
}

/** The median round of a cell, by throughput, and the per-round figures around it. */
function summarizeCell(cell: Cell, rounds: readonly RoundResult[]): CellResult {
  const rps = rounds.map((r) => r.load.rps)
  const mid = median(rps)
  const middle = [...rounds].sort((a, b) => Math.abs(a.load.rps - mid) - Math.abs(b.load.rps - mid))[0]!
  const med = (pick: (r: RoundResult) => number) => round2(median(rounds.map(pick)))
  return {
    cell,
    rounds: rps.map(Math.round),
    rps: Math.round(mid),
    p50: med((r) => r.load.p50),
    p99: med((r) => r.load.p99),
    cpuUs: { process: med((r) => r.cpuUs.process), postgres: med((r) => r.cpuUs.postgres), provider: med((r) => r.cpuUs.provider), wrk: med((r) => r.cpuUs.wrk) },
    busyPercent: med((r) => r.machine.busyPercent),
    othersPercent: med((r) => r.machine.othersPercent),
    hotPercent: rounds.every((r) => r.hotPercent !== undefined) ? med((r) => r.hotPercent!) : undefined,
    exactlyOnce: { rounds: rounds.length, held: rounds.filter((r) => r.exactlyOnce.ok).length, payments: rounds.reduce((sum, r) => sum + r.exactlyOnce.payments, 0), charges: rounds.reduce((sum, r) => sum + r.exactlyOnce.charges, 0) },
    statements: middle.statements,
    requests: middle.load.requests,
  }
}

/** /metrics and the purge on a copy of the 1M-key table. */
async function timeMaintenance(server: BenchServer, large: string, provider: BenchProvider, services: Service[]) {
  const url = await server.create(`idem_bench_maintenance_${crypto.randomUUID().slice(0, 6)}`, large)
  const sql = postgres(url, { max: 2, onnotice: () => undefined })
  try {
    const service = await startService(url, provider.url, { METRICS_CACHE_MS: '0' })
    services.push(service)
    const [row] = await sql<{ keys: number }[]>`select count(*)::int as keys from idempotency_keys`
    const keys = row?.keys ?? 0
    log(`${keys.toLocaleString('en')} keys in the table; scraping /metrics`)
    const scrape = { ...(await timeScrapes(service.url)), keys, loadAverage: load1() }
    await stopService(service, services)
    log('purging completed keys past retention (core/purge.ts, as of a clock 2 days ahead)')
    const purge = { ...(await timePurge(sql)), loadAverage: load1() }
    return { scrape, purge }
  } finally {
    await sql.end()
  }
}

await main()
