/**
 * `npm run bench`: one run, all figures, on a fresh database.
 *
 * Three routes of one service process make the same payment through the same
 * provider client (BENCH_BASELINE_ROUTE=1 adds the two yardsticks):
 * - fresh: the idempotent `POST /api/payments`;
 * - naive: the check-then-insert of the usual articles (payments/bench-naive.ts);
 * - baseline: no idempotency at all (payments/bench-baseline.ts).
 *
 * 1. database statements, round trips and transactions per request, counted
 *    on the wire, one request at a time and 32 at a time;
 * 2. slow provider (200 ms), 256 connections: baseline, naive and fresh in
 *    interleaved rounds, on a quiet machine and with one core kept busy by
 *    `stress-ng --cpu 1` (interleaved too); then 64 connections, quiet;
 * 3. instant provider, 32 connections: the same, plus replays of completed
 *    keys on both the idempotent and the naive route;
 * 4. what the fresh payments did to the tables: updates and HOT updates
 *    (pg_stat_user_tables), dead index entries (pageinspect); and, when the
 *    server has pg_stat_statements loaded, each statement's time and WAL;
 * 5. 409s: retries of one in-flight key, 300 at once and 32 at a time;
 * 6. /metrics scrape time with 1M keys in the table, and the purge rate;
 * plus the exactly-once check at both ends: one payment per replayed key, and
 * one charge in the simulators' ledgers per idempotent payment.
 *
 * Load comes from autocannon (closed loop) in this process. The service is
 * `bun src/main.ts` in its own process, as users run it; each provider
 * simulator is its own process too (src/provider/spawn.ts), with its ledger on
 * tmpfs (bench/provider.ts says why). Every figure is printed with the load
 * average beside it. Results are printed as Markdown and saved to
 * .data/bench-last.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs'
import { cpus, loadavg } from 'node:os'
import postgres from 'postgres'
import { BENCH_BASELINE_ROUTE } from '../src/payments/bench-baseline'
import { BENCH_NAIVE_ROUTE, NAIVE_DOWNSTREAM_PREFIX } from '../src/payments/bench-naive'
import { measureCpu } from './cpu'
import { freshDatabase } from './database'
import { runLoad, summarize, round2, type CpuTotals, type LoadResult, type RoundResult, type Throughput } from './load'
import { timePurge, timeScrapes } from './maintenance'
import { readStatements, resetStatements } from './pg-statements'
import { startHoldingProvider, startProvider, type BenchProvider, type LedgerCharge } from './provider'
import { report, type Results } from './report'
import { measureRoundTrips, paymentBody } from './round-trips'
import { seedKeys } from './seed'
import { BENCH_API_KEY, startService, type Service } from './service'
import { keyRunElsewhere, keyRunHere, runStorm, STORM_CONNECTIONS, STORM_WAVES, type Load } from './storm'
import { startStress, stressAvailable, STRESS_COMMAND, STRESS_INSTALL_HINT, type Stress } from './stress'
import { indexChurn, readTableCounters, updatedTables, waitForBackendsGone } from './table-stats'

const setting = (name: string, fallback: number) => {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number >= 0, got ${raw}`)
  return value
}

export const SETTINGS = Object.freeze({
  /** Seconds per measured round of the instant-provider kinds. */
  roundSeconds: setting('BENCH_ROUND_SECONDS', 5),
  /** Seconds per measured round of the slow-provider kinds: 25 provider round trips per connection at 200 ms. */
  slowRoundSeconds: setting('BENCH_SLOW_ROUND_SECONDS', 5),
  /** Rounds of each kind, alternating in order (A B C, then C B A), so drift hits all kinds alike. */
  rounds: setting('BENCH_ROUNDS', 2),
  /** Instant provider: twice the service's 16 database connections, so it is never idle (the issue's figure). */
  connections: setting('BENCH_CONNECTIONS', 32),
  /** Slow provider: the issue's figure, hundreds of clients waiting on a real provider at once. */
  slowConnections: setting('BENCH_SLOW_CONNECTIONS', 256),
  /**
   * The same 200 ms provider with fewer clients, so the machine has CPU to spare: what the
   * design costs when the provider's latency, not the CPU, is the limit. 0 skips it.
   */
  slowLightConnections: setting('BENCH_SLOW_LIGHT_CONNECTIONS', 64),
  /** Seconds per round of that lighter run. */
  slowLightRoundSeconds: setting('BENCH_SLOW_LIGHT_ROUND_SECONDS', 3),
  /** A real provider's fast answer: card networks take 200 to 2,000 ms. */
  slowProviderMs: setting('BENCH_SLOW_PROVIDER_MS', 200),
  /** 1: every slow and instant round is run again with `stress-ng --cpu 1` (when installed); 0 skips that. */
  stress: setting('BENCH_STRESS', 1),
  /** Concurrent requests of the wire count's second part (the issue: 32 or more). */
  roundTripConnections: setting('BENCH_RT_CONNECTIONS', 32),
  /** Fresh requests counted at that concurrency. */
  roundTripRequests: setting('BENCH_RT_REQUESTS', 2000),
  /** Keys seeded for the scrape and purge timings; 0 skips both. */
  seedKeys: setting('BENCH_SEED_KEYS', 1_000_000),
})

/** Seconds of unmeasured load before the rounds: sockets, pools and prepared statements warm up. */
const WARMUP_SECONDS = 2
/** The bench's own connections, told apart from the service's in pg_stat_activity. */
const BENCH_APPLICATION = 'idem-bench'

const load1 = () => round2(loadavg()[0]!)
const log = (line: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)} load ${load1()}] ${line}`)
const headers = { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json' }
/** The n-th request of a run; `tag` (a round's name) makes fresh keys new in every run. */
type LoadRequest = (n: number, tag?: string) => { body: string; key?: string }
type Kinds<K extends string> = Record<K, [path: string, request: LoadRequest]>
const baselineRequest: LoadRequest = (n) => ({ body: JSON.stringify(paymentBody(n)) })
/** Fresh keys; the naive route's all start with `naive-`, so its payments are told apart from the idempotent route's. */
const freshRequest = (prefix: string): LoadRequest => (n, tag = '') => ({ body: JSON.stringify(paymentBody(n)), key: `${prefix}${tag}-${n}` })

export type Condition = 'quiet' | 'busy'

async function main(): Promise<void> {
  const runStarted = performance.now()
  const loadBefore = load1()
  const db = await freshDatabase(log)
  const database = new URL(db.url).pathname.slice(1)
  log(`database ${db.url.replace(/\/\/[^@]*@/, '//')} (PostgreSQL ${db.version})`)
  const sql = postgres(db.url, { max: 2, onnotice: () => undefined, connection: { application_name: BENCH_APPLICATION } })
  const providers: BenchProvider[] = []
  const services: Service[] = []
  const stresses: Stress[] = []
  const startedService = async (provider: BenchProvider, env: Record<string, string> = {}, bunArgs: string[] = []) => {
    const service = await startService(db.url, provider.url, env, bunArgs)
    services.push(service)
    log(`service ${service.url}, pid ${service.proc.pid} (for perf record -p)`)
    return service
  }
  /** Stops it and waits until its backends are gone: they flush their table counters on exit. */
  const stopService = async (service: Service) => {
    services.splice(services.indexOf(service), 1)
    await service.stop()
    await waitForBackendsGone(sql, database, BENCH_APPLICATION)
  }
  const conditions: Condition[] = ['quiet']
  let stressNote: string
  if (SETTINGS.stress === 0) stressNote = 'skipped (BENCH_STRESS=0)'
  else if (!stressAvailable()) stressNote = `skipped: stress-ng is not installed (${STRESS_INSTALL_HINT})`
  else {
    conditions.push('busy')
    stressNote = `\`${STRESS_COMMAND.join(' ')}\` during the "busy" rounds`
  }
  log(`one core busy: ${stressNote}`)
  try {
    const instant = await startProvider(0)
    providers.push(instant)
    const slow = await startProvider(SETTINGS.slowProviderMs)
    providers.push(slow)

    log(`counting database statements and round trips per request (a service behind a wire-protocol counter), one at a time and ${SETTINGS.roundTripConnections} at a time`)
    const roundTrips = await measureRoundTrips(db.url, instant.url, { connections: SETTINGS.roundTripConnections, requests: SETTINGS.roundTripRequests })
    await waitForBackendsGone(sql, database, BENCH_APPLICATION)
    const tablesBefore = await readTableCounters(sql)

    /** Rounds of `kinds`, interleaved, under every condition, with stress-ng started and stopped around each busy block. */
    const roundsUnder = <K extends string>(kinds: Kinds<K>, run: Run, seconds: number, options: { warmUp?: boolean; conditions?: Condition[] } = {}) =>
      rounds(kinds, run, seconds, {
        ...options,
        conditions: options.conditions ?? conditions,
        busy: async () => {
          // Its own timeout bounds it should the bench die: one block of rounds, and a margin.
          const stress = await startStress(Object.keys(kinds).length * seconds * 2 + 60)
          stresses.push(stress)
          return async () => {
            stresses.splice(stresses.indexOf(stress), 1)
            await stress.stop()
          }
        },
      })

    const slowKinds = (tag: string): Kinds<'baseline' | 'naive' | 'fresh'> => ({
      baseline: [BENCH_BASELINE_ROUTE, baselineRequest],
      naive: [BENCH_NAIVE_ROUTE, freshRequest(`naive-${tag}`)],
      fresh: ['/api/payments', freshRequest(tag)],
    })
    log(`slow provider (${SETTINGS.slowProviderMs} ms), ${SETTINGS.slowConnections} connections: warm-up, then baseline, naive and fresh, ${SETTINGS.slowRoundSeconds} s each, ${SETTINGS.rounds} rounds, ${conditions.join(' and ')}`)
    const slowService = await startedService(slow)
    const slowRun = (connections: number): Run => (path, request, durationS) =>
      measureCpu(sql, database, { service: slowService.proc.pid, provider: slow.pid }, () =>
        runLoad({ url: `${slowService.url}${path}`, connections, durationS, headers, request }))
    const slowRuns = await roundsUnder(slowKinds('s'), slowRun(SETTINGS.slowConnections), SETTINGS.slowRoundSeconds)
    let slowLightRuns: Results['slowLight'] = undefined
    if (SETTINGS.slowLightConnections > 0) {
      log(`slow provider, ${SETTINGS.slowLightConnections} connections: baseline, naive and fresh, ${SETTINGS.slowLightRoundSeconds} s each, ${SETTINGS.rounds} rounds, quiet`)
      const light = await roundsUnder(slowKinds('l'), slowRun(SETTINGS.slowLightConnections), SETTINGS.slowLightRoundSeconds, { warmUp: false, conditions: ['quiet'] })
      slowLightRuns = { providerMs: SETTINGS.slowProviderMs, connections: SETTINGS.slowLightConnections, quiet: light.quiet }
    }
    await stopService(slowService)

    // BENCH_PROFILE=1: the service writes a CPU profile (Markdown) to .data/bench-profile/ when it stops.
    const profile = process.env.BENCH_PROFILE === '1' ? ['--cpu-prof-md', '--cpu-prof-dir=.data/bench-profile'] : []
    const service = await startedService(instant, { METRICS_CACHE_MS: '0' }, profile)
    const load = (path: string, request: (n: number) => { body: string; key?: string }, extra: { connections?: number; durationS?: number; amount?: number } = {}) =>
      runLoad({ url: `${service.url}${path}`, connections: extra.connections ?? SETTINGS.connections, headers, request, ...(extra.amount !== undefined ? { amount: extra.amount } : { durationS: extra.durationS ?? SETTINGS.roundSeconds }) })
    const measured: Run = (path, request, durationS) =>
      measureCpu(sql, database, { service: service.proc.pid, provider: instant.pid }, () => load(path, request, { durationS }))

    log(`instant provider, ${SETTINGS.connections} connections: warm-up, then baseline, naive, fresh and both replays, ${SETTINGS.roundSeconds} s each, ${SETTINGS.rounds} rounds, ${conditions.join(' and ')}`)
    await load('/api/payments', freshRequest('w'), { durationS: WARMUP_SECONDS })
    await load(BENCH_NAIVE_ROUTE, freshRequest('naive-w'), { durationS: WARMUP_SECONDS })
    // Replays replay the warm-ups' keys (key w-n has body paymentBody(n)); the payments say which completed.
    const completed = async (prefix: string) => {
      const rows = await sql<{ key: string }[]>`select idempotency_key as key from payments where idempotency_key like ${`${prefix}-%`} limit 5000`
      const done = rows.map((row) => Number(row.key.slice(prefix.length + 1)))
      if (done.length === 0) throw new Error(`the ${prefix} warm-up completed no payment; the service said:\n${service.output().slice(-2000)}`)
      return (n: number) => { const k = done[n % done.length]!; return { body: JSON.stringify(paymentBody(k)), key: `${prefix}-${k}` } }
    }
    // pg_stat_statements (when loaded) over the instant rounds: every route's statements, their time and WAL.
    const statementsReset = await resetStatements(sql)
    const instantRuns = await roundsUnder(
      {
        baseline: [BENCH_BASELINE_ROUTE, baselineRequest],
        naive: [BENCH_NAIVE_ROUTE, freshRequest('naive-f')],
        fresh: ['/api/payments', freshRequest('f')],
        replay: ['/api/payments', await completed('w')],
        naiveReplay: [BENCH_NAIVE_ROUTE, await completed('naive-w')],
      },
      measured,
      SETTINGS.roundSeconds,
    )
    const statements: Results['statements'] = statementsReset.ok ? { ok: true, statements: await readStatements(sql) } : statementsReset
    // Exactly once under load: the replayed keys still have one payment each, however many replays.
    const replayed = (await sql<{ payments: number; keys: number }[]>`
      select count(*)::int as payments, count(distinct idempotency_key)::int as keys from payments where idempotency_key like 'w-%'`)[0]!
    await stopService(service)

    log('reading what the fresh payments did to the tables (pg_stat_user_tables) and their indexes (pageinspect)')
    const tables = updatedTables(await readTableCounters(sql), tablesBefore)
    const indexes = await indexChurn(sql, tables.map((t) => t.table))
    const tablesLoadAverage = load1()

    // The 409 storms' service charges through a provider that holds its one charge (the key it runs itself).
    const holding = startHoldingProvider()
    const after = await startedService({ ...instant, url: holding.url }, { METRICS_CACHE_MS: '0' })
    const stormLoad: Load = (path, request, extra) => runLoad({
      url: `${after.url}${path}`, connections: extra.connections ?? SETTINGS.connections, headers, request,
      ...(extra.amount !== undefined ? { amount: extra.amount } : { durationS: extra.durationS ?? SETTINGS.roundSeconds }),
    })
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

    let scrape: Results['scrape'] = undefined
    let purge: Results['purge'] = undefined
    if (SETTINGS.seedKeys > 0) {
      log(`seeding ${SETTINGS.seedKeys.toLocaleString('en')} keys (bench/seed.ts)`)
      await seedKeys(sql, SETTINGS.seedKeys)
      const keys = (await sql<{ keys: number }[]>`select count(*)::int as keys from idempotency_keys`)[0]?.keys ?? 0
      log(`${keys.toLocaleString('en')} keys in the table; scraping /metrics`)
      scrape = { ...(await timeScrapes(after.url)), keys, loadAverage: load1() }
      log('purging completed keys past retention (core/purge.ts, as of a clock 2 days ahead)')
      purge = { ...(await timePurge(sql)), loadAverage: load1() }
    }
    await stopService(after)

    // Every service has drained: each idempotent payment's charge is in a ledger, and nothing else is.
    const charges = (await Promise.all(providers.splice(0).map((provider) => provider.stop()))).flat()
    const provider = await checkCharges(sql, charges)

    const results: Results = {
      at: new Date().toISOString(),
      machine: { ...machine(db.version), loadBefore, loadAfter: load1() },
      settings: { ...SETTINGS, stormConnections: STORM_CONNECTIONS, stormWaves: STORM_WAVES },
      stress: { conditions, note: stressNote },
      slow: { providerMs: SETTINGS.slowProviderMs, connections: SETTINGS.slowConnections, ...slowRuns },
      slowLight: slowLightRuns,
      instant: { connections: SETTINGS.connections, ...instantRuns },
      replayed,
      provider,
      roundTrips,
      tables: { changes: tables, indexes, loadAverage: tablesLoadAverage },
      statements,
      storm: { ...storm, loadAverage: stormLoadAverage },
      stormHere: { ...stormHere, loadAverage: ownLoadAverage },
      scrape,
      purge,
      totalSeconds: Math.round((performance.now() - runStarted) / 1000),
    }
    mkdirSync('.data', { recursive: true })
    writeFileSync('.data/bench-last.json', JSON.stringify(results, null, 2))
    console.log(report(results))
  } finally {
    for (const stress of stresses.splice(0)) await stress.stop().catch(() => undefined)
    for (const service of services.splice(0)) await service.stop().catch(() => undefined)
    for (const provider of providers.splice(0)) await provider.stop().catch(() => undefined)
    await sql.end()
    await db.drop()
  }
}

type Run = (path: string, request: LoadRequest, durationS: number) => Promise<{ result: LoadResult; cpu: CpuTotals }>

/**
 * A warm-up of every kind, then `SETTINGS.rounds` rounds. In each round every
 * condition runs once, in alternating order (quiet then busy, then busy then
 * quiet), and under it every kind once, in alternating order too (A B C, then
 * C B A): a drift in what else the machine does then hits all kinds and both
 * conditions alike, and their ratios hold. `busy()` starts the other process
 * that keeps a core busy and returns its stop.
 */
async function rounds<Kind extends string>(
  kinds: Kinds<Kind>,
  run: Run,
  roundSeconds: number,
  options: { warmUp?: boolean; conditions: Condition[]; busy: () => Promise<() => Promise<void>> },
): Promise<Partial<Record<Condition, Record<Kind, Throughput>>> & { quiet: Record<Kind, Throughput> }> {
  const names = Object.keys(kinds) as Kind[]
  const runs = new Map<Condition, Map<Kind, RoundResult[]>>(options.conditions.map((c) => [c, new Map(names.map((kind) => [kind, []]))]))
  for (const kind of options.warmUp === false ? [] : names) {
    const [path, request] = kinds[kind]
    await run(path, (n) => request(n, 'warm'), WARMUP_SECONDS)
  }
  let block = 0
  for (let round = 1; round <= SETTINGS.rounds; round++) {
    for (const condition of round % 2 === 1 ? options.conditions : [...options.conditions].reverse()) {
      const stop = condition === 'busy' ? await options.busy() : undefined
      try {
        for (const kind of block++ % 2 === 0 ? names : [...names].reverse()) {
          const [path, request] = kinds[kind]
          const started = load1()
          const { result, cpu } = await run(path, (n) => request(n, `${condition[0]}${round}`), roundSeconds)
          runs.get(condition)!.get(kind)!.push({ load: result, cpu, loadAverage: [started, load1()] })
          log(`${condition} round ${round} ${kind}: ${Math.round(result.rps)}/s, machine ${Math.round(cpu.machineBusyShare * 100)}% busy`)
        }
      } finally {
        await stop?.()
      }
    }
  }
  const out: Partial<Record<Condition, Record<Kind, Throughput>>> = {}
  for (const [condition, byKind] of runs) out[condition] = Object.fromEntries(names.map((kind) => [kind, summarize(byKind.get(kind)!)])) as Record<Kind, Throughput>
  return out as Partial<Record<Condition, Record<Kind, Throughput>>> & { quiet: Record<Kind, Throughput> }
}

/**
 * Exactly once at the provider (Exactly once at the provider, docs/invariants.md), across every service of
 * the run: each idempotent payment's provider_reference is a charge made under
 * one of our downstream keys (`idp_`), no two payments share one, and every
 * such charge has its payment. The yardsticks' charges (`bench_` and `naive_`
 * keys) and payments (key `bench-baseline`, keys starting `naive-`) are
 * counted apart. A charge without a payment would be a key released after
 * its charge (a failed completion): its retry would get the same charge back.
 */
async function checkCharges(sql: postgres.Sql, charges: readonly LedgerCharge[]) {
  const ours = new Set(charges.filter((charge) => charge.key.startsWith('idp_')).map((charge) => charge.id))
  const baselineCharges = charges.filter((charge) => charge.key.startsWith('bench_')).length
  const naiveCharges = charges.filter((charge) => charge.key.startsWith(NAIVE_DOWNSTREAM_PREFIX)).length
  const payments = await sql<{ provider_ref: string }[]>`select provider_ref from payments where idempotency_key <> 'bench-baseline' and idempotency_key not like 'naive-%'`
  const [others] = await sql<{ baseline: number; naive: number }[]>`
    select count(*) filter (where idempotency_key = 'bench-baseline')::int as baseline,
           count(*) filter (where idempotency_key like 'naive-%')::int as naive
      from payments`
  const refs = new Set(payments.map((payment) => payment.provider_ref))
  return {
    idempotentPayments: payments.length,
    idempotentCharges: ours.size,
    paymentsSharingACharge: payments.length - refs.size,
    paymentsWithoutCharge: [...refs].filter((ref) => !ours.has(ref)).length,
    chargesWithoutPayment: [...ours].filter((id) => !refs.has(id)).length,
    baselinePayments: others!.baseline,
    baselineCharges,
    naivePayments: others!.naive,
    naiveCharges,
  }
}

function machine(postgresVersion: string) {
  const cpu = cpus()[0]?.model ?? 'unknown'
  return { nproc: cpus().length, cpu, postgres: postgresVersion, bun: Bun.version, os: `${process.platform} ${process.arch}` }
}

await main()
