/**
 * `npm run bench`: one run, all figures, on a fresh database.
 *
 * 1. slow provider: the provider simulator answers every charge after 200 ms;
 *    256 connections of fresh idempotent POSTs vs the same payment without
 *    idempotency (the bench-only route, BENCH_BASELINE_ROUTE=1), in alternating rounds;
 * 2. instant provider: the same at 32 connections with a 0 ms simulator, and
 *    replays of completed keys;
 * 3. database statements and round trips per request, counted on the wire;
 * 4. 409s: retries of one in-flight key, 300 at once and 32 at a time;
 * 5. /metrics scrape time with 1M keys in the table, and the purge rate;
 * plus the exactly-once check at both ends: one payment per replayed key, and
 * one charge in the simulators' ledgers per idempotent payment.
 *
 * Load comes from autocannon (closed loop) in this process. The service is
 * `bun src/main.ts` in its own process, as users run it; each provider
 * simulator is its own process too (src/provider/spawn.ts), with its ledger on
 * tmpfs (bench/provider.ts says why). Results are printed as Markdown and
 * saved to .data/bench-last.json.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { cpus } from 'node:os'
import postgres from 'postgres'
import { BENCH_BASELINE_ROUTE } from '../src/payments/bench-baseline'
import { measureCpu } from './cpu'
import { freshDatabase } from './database'
import { runLoad, summarize, round2, type CpuTotals, type LoadResult, type Throughput } from './load'
import { timePurge, timeScrapes } from './maintenance'
import { startProvider, type BenchProvider, type LedgerCharge } from './provider'
import { report, type Results } from './report'
import { measureRoundTrips, paymentBody } from './round-trips'
import { seedKeys } from './seed'
import { BENCH_API_KEY, startService, type Service } from './service'
import { runStorm, STORM_CONNECTIONS, STORM_WAVES } from './storm'

const setting = (name: string, fallback: number) => {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number >= 0, got ${raw}`)
  return value
}

export const SETTINGS = Object.freeze({
  /** Seconds per measured round of the instant-provider kinds (baseline, fresh, replay). */
  roundSeconds: setting('BENCH_ROUND_SECONDS', 5),
  /** Seconds per measured round of the slow-provider kinds: 25 provider round trips per connection at 200 ms. */
  slowRoundSeconds: setting('BENCH_SLOW_ROUND_SECONDS', 5),
  /** Rounds of each kind, alternating in order (A B, then B A), so drift hits all kinds alike. */
  rounds: setting('BENCH_ROUNDS', 2),
  /** Instant provider: twice the service's 16 database connections, so it is never idle (the figure). */
  connections: setting('BENCH_CONNECTIONS', 32),
  /** Slow provider: the figure, hundreds of clients waiting on a real provider at once. */
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
  /** Keys seeded for the scrape and purge timings; 0 skips both. */
  seedKeys: setting('BENCH_SEED_KEYS', 1_000_000),
})

/** Seconds of unmeasured load before the rounds: sockets, pools and prepared statements warm up. */
const WARMUP_SECONDS = 2

const log = (line: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}`)
const headers = { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json' }
/** The n-th request of a run; `tag` (a round's name) makes fresh keys new in every run. */
type LoadRequest = (n: number, tag?: string) => { body: string; key?: string }
const baselineRequest: LoadRequest = (n) => ({ body: JSON.stringify(paymentBody(n)) })
const freshRequest = (prefix: string): LoadRequest => (n, tag = '') => ({ body: JSON.stringify(paymentBody(n)), key: `${prefix}${tag}-${n}` })

async function main(): Promise<void> {
  const runStarted = performance.now()
  const loadBefore = loadAverage()
  const db = await freshDatabase(log)
  const database = new URL(db.url).pathname.slice(1)
  log(`database ${db.url.replace(/\/\/[^@]*@/, '//')} (PostgreSQL ${db.version}); load average ${loadBefore}`)
  const sql = postgres(db.url, { max: 2, onnotice: () => undefined })
  const providers: BenchProvider[] = []
  const services: Service[] = []
  const startedService = async (provider: BenchProvider, env: Record<string, string> = {}, bunArgs: string[] = []) => {
    const service = await startService(db.url, provider.url, env, bunArgs)
    services.push(service)
    return service
  }
  const stopService = async (service: Service) => {
    services.splice(services.indexOf(service), 1)
    await service.stop()
  }
  try {
    const instant = await startProvider(0)
    providers.push(instant)
    const slow = await startProvider(SETTINGS.slowProviderMs)
    providers.push(slow)

    log('counting database statements and round trips per request (a service behind a wire-protocol counter)')
    const roundTrips = await measureRoundTrips(db.url, instant.url)

    log(`slow provider (${SETTINGS.slowProviderMs} ms), ${SETTINGS.slowConnections} connections: warm-up, then baseline and fresh, ${SETTINGS.slowRoundSeconds} s each, ${SETTINGS.rounds} rounds`)
    const slowService = await startedService(slow)
    const slowRun = (connections: number) => (path: string, request: LoadRequest, durationS: number) =>
      measureCpu(sql, database, { service: slowService.proc.pid, provider: slow.pid }, () =>
        runLoad({ url: `${slowService.url}${path}`, connections, durationS, headers, request }))
    const slowKinds = (prefix: string) => ({ baseline: [BENCH_BASELINE_ROUTE, baselineRequest], fresh: ['/api/payments', freshRequest(prefix)] }) satisfies Record<string, [string, LoadRequest]>
    const slowRuns = await rounds(slowKinds('s'), slowRun(SETTINGS.slowConnections), SETTINGS.slowRoundSeconds)
    let slowLightRuns: Awaited<ReturnType<typeof rounds<'baseline' | 'fresh'>>> | undefined
    if (SETTINGS.slowLightConnections > 0) {
      log(`slow provider, ${SETTINGS.slowLightConnections} connections: baseline and fresh, ${SETTINGS.slowLightRoundSeconds} s each, ${SETTINGS.rounds} rounds`)
      slowLightRuns = await rounds(slowKinds('l'), slowRun(SETTINGS.slowLightConnections), SETTINGS.slowLightRoundSeconds, { warmUp: false })
    }
    await stopService(slowService)

    // METRICS_CACHE_MS=0: every scrape below queries the database (the default caches for 5 s).
    // BENCH_PROFILE=1: the service writes a CPU profile (Markdown) to .data/bench-profile/ when it stops.
    const profile = process.env.BENCH_PROFILE === '1' ? ['--cpu-prof-md', '--cpu-prof-dir=.data/bench-profile'] : []
    const service = await startedService(instant, { METRICS_CACHE_MS: '0' }, profile)
    const load = (path: string, request: (n: number) => { body: string; key?: string }, extra: { connections?: number; durationS?: number; amount?: number } = {}) =>
      runLoad({ url: `${service.url}${path}`, connections: extra.connections ?? SETTINGS.connections, headers, request, ...(extra.amount !== undefined ? { amount: extra.amount } : { durationS: extra.durationS ?? SETTINGS.roundSeconds }) })
    const measured = (path: string, request: LoadRequest, durationS: number) =>
      measureCpu(sql, database, { service: service.proc.pid, provider: instant.pid }, () => load(path, request, { durationS }))

    log(`instant provider, ${SETTINGS.connections} connections: warm-up, then baseline, fresh and replay, ${SETTINGS.roundSeconds} s each, ${SETTINGS.rounds} rounds`)
    await load('/api/payments', freshRequest('w'), { durationS: WARMUP_SECONDS })
    // Replays replay the warm-up's keys: their bodies are paymentBody(n) for key w-n.
    const done = (await sql<{ key: string }[]>`select key from idempotency_keys where status = 'done' and key like 'w-%' limit 5000`).map((row) => Number(row.key.slice(2)))
    if (done.length === 0) throw new Error(`the warm-up completed no payment; the service said:\n${service.output().slice(-2000)}`)
    const replayRequest: LoadRequest = (n) => { const k = done[n % done.length]!; return { body: JSON.stringify(paymentBody(k)), key: `w-${k}` } }
    const instantRuns = await rounds(
      { baseline: [BENCH_BASELINE_ROUTE, baselineRequest], fresh: ['/api/payments', freshRequest('f')], replay: ['/api/payments', replayRequest] },
      measured,
      SETTINGS.roundSeconds,
    )
    // Exactly once under load: the replayed keys still have one payment each, however many replays.
    const replayed = (await sql<{ payments: number; keys: number }[]>`
      select count(*)::int as payments, count(distinct idempotency_key)::int as keys from payments where idempotency_key like 'w-%'`)[0]!

    log(`409s: ${STORM_CONNECTIONS} concurrent retries of one in-flight key, ${STORM_WAVES} waves, then ${SETTINGS.connections} at a time for ${SETTINGS.roundSeconds} s`)
    const storm = await runStorm(sql, service.url, (path, request, extra) => load(path, request, extra), {
      connections: SETTINGS.connections,
      seconds: SETTINGS.roundSeconds,
      measure: (work) => measureCpu(sql, database, { service: service.proc.pid, provider: instant.pid }, work),
    })

    let scrape: Results['scrape'] = undefined
    let purge: Results['purge'] = undefined
    if (SETTINGS.seedKeys > 0) {
      log(`seeding ${SETTINGS.seedKeys.toLocaleString('en')} keys with generate_series`)
      await seedKeys(sql, SETTINGS.seedKeys)
      const keys = (await sql<{ keys: number }[]>`select count(*)::int as keys from idempotency_keys`)[0]?.keys ?? 0
      log(`${keys.toLocaleString('en')} keys in the table; scraping /metrics`)
      scrape = { ...(await timeScrapes(service.url)), keys }
      log('purging completed keys past retention (core/purge.ts, as of a clock 2 days ahead)')
      purge = await timePurge(sql)
    }
    await stopService(service)

    // Every service has drained: each idempotent payment's charge is in a ledger, and nothing else is.
    const charges = (await Promise.all(providers.splice(0).map((provider) => provider.stop()))).flat()
    const provider = await checkCharges(sql, charges)

    const results: Results = {
      at: new Date().toISOString(),
      machine: { ...machine(db.version), loadBefore, loadAfter: loadAverage() },
      settings: { ...SETTINGS, stormConnections: STORM_CONNECTIONS, stormWaves: STORM_WAVES },
      slow: { providerMs: SETTINGS.slowProviderMs, ...slowRuns, freshVsBaseline: round2(slowRuns.fresh.rps / slowRuns.baseline.rps) },
      slowLight: slowLightRuns && { providerMs: SETTINGS.slowProviderMs, ...slowLightRuns, freshVsBaseline: round2(slowLightRuns.fresh.rps / slowLightRuns.baseline.rps) },
      instant: {
        ...instantRuns,
        freshVsBaseline: round2(instantRuns.fresh.rps / instantRuns.baseline.rps),
        replayVsFresh: round2(instantRuns.replay.rps / instantRuns.fresh.rps),
      },
      replayed,
      provider,
      roundTrips,
      storm,
      scrape,
      purge,
      totalSeconds: Math.round((performance.now() - runStarted) / 1000),
    }
    mkdirSync('.data', { recursive: true })
    writeFileSync('.data/bench-last.json', JSON.stringify(results, null, 2))
    console.log(report(results))
  } finally {
    for (const service of services.splice(0)) await service.stop().catch(() => undefined)
    for (const provider of providers.splice(0)) await provider.stop().catch(() => undefined)
    await sql.end()
    await db.drop()
  }
}

/**
 * A warm-up of every kind, then `SETTINGS.rounds` rounds in which every kind
 * runs once, in alternating order (A B C, then C B A, ...): a drift in what
 * else the machine does then hits all kinds alike, and their ratio holds.
 */
async function rounds<Kind extends string>(
  kinds: Record<Kind, [path: string, request: LoadRequest]>,
  run: (path: string, request: LoadRequest, durationS: number) => Promise<{ result: LoadResult; cpu: CpuTotals }>,
  roundSeconds: number,
  options: { warmUp?: boolean } = {},
): Promise<Record<Kind, Throughput>> {
  const names = Object.keys(kinds) as Kind[]
  const runs = Object.fromEntries(names.map((kind) => [kind, [] as { load: LoadResult; cpu: CpuTotals }[]])) as Record<Kind, { load: LoadResult; cpu: CpuTotals }[]>
  for (const kind of options.warmUp === false ? [] : names) {
    const [path, request] = kinds[kind]
    await run(path, (n) => request(n, 'warm'), WARMUP_SECONDS)
  }
  for (let round = 1; round <= SETTINGS.rounds; round++) {
    for (const kind of round % 2 === 1 ? names : [...names].reverse()) {
      const [path, request] = kinds[kind]
      const { result, cpu } = await run(path, (n) => request(n, String(round)), roundSeconds)
      runs[kind].push({ load: result, cpu })
    }
  }
  return Object.fromEntries(names.map((kind) => [kind, summarize(runs[kind])])) as Record<Kind, Throughput>
}

/**
 * Exactly once at the provider (Exactly once at the provider, docs/invariants.md), across every service of
 * the run: each idempotent payment's provider_reference is a charge made under
 * one of our downstream keys (`idp_`), no two payments share one, and every
 * such charge has its payment. The baseline's charges (`bench_` keys) are
 * counted apart. A charge without a payment would be a key released after
 * its charge (a failed completion): its retry would get the same charge back.
 */
async function checkCharges(sql: postgres.Sql, charges: readonly LedgerCharge[]) {
  const ours = new Set(charges.filter((charge) => charge.key.startsWith('idp_')).map((charge) => charge.id))
  const baselineCharges = charges.filter((charge) => charge.key.startsWith('bench_')).length
  const payments = await sql<{ provider_ref: string }[]>`select provider_ref from payments where idempotency_key <> 'bench-baseline'`
  const baselinePayments = (await sql<{ n: number }[]>`select count(*)::int as n from payments where idempotency_key = 'bench-baseline'`)[0]!.n
  const refs = new Set(payments.map((payment) => payment.provider_ref))
  return {
    idempotentPayments: payments.length,
    idempotentCharges: ours.size,
    paymentsSharingACharge: payments.length - refs.size,
    paymentsWithoutCharge: [...refs].filter((ref) => !ours.has(ref)).length,
    chargesWithoutPayment: [...ours].filter((id) => !refs.has(id)).length,
    baselinePayments,
    baselineCharges,
  }
}

/** The 1-minute load average: anything well above the bench's own ~2 means other work shared the CPUs. */
function loadAverage(): number {
  try {
    return Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[0])
  } catch {
    return Number.NaN // not Linux
  }
}

function machine(postgresVersion: string) {
  const cpu = cpus()[0]?.model ?? 'unknown'
  return { nproc: cpus().length, cpu, postgres: postgresVersion, bun: Bun.version, os: `${process.platform} ${process.arch}` }
}

await main()
