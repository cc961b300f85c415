/**
 * `npm run bench`: one run, all figures, on a fresh database.
 *
 * 1. fresh idempotent POSTs vs the same payment insert without idempotency
 *    (the bench-only route BENCH_BASELINE_ROUTE=1), in alternating rounds;
 * 2. replays vs fresh;
 * 3. a 300-retry storm on one in-flight key: p50/p99 of the 409 answers;
 * 4. /metrics scrape time with 1M keys in the table;
 * 5. purge rate of completed keys past retention (core/purge.ts);
 * plus database round trips per request, counted on the wire, and fresh vs
 * baseline again with a 20 ms provider call.
 *
 * Load comes from autocannon (closed loop) running in this process; the
 * service is `bun src/main.ts` in its own process, as users run it.
 * Results are printed as Markdown and saved to .data/bench-last.json.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { cpus } from 'node:os'
import postgres from 'postgres'
import { fingerprint } from '../src/core/fingerprint'
import { purgeExpired, PURGE_BATCH_SIZE } from '../src/core/purge'
import { PURGE_PAUSE_MS } from '../src/maintenance/retention-purge'
import { BENCH_BASELINE_ROUTE } from '../src/payments/bench-baseline'
import { freshDatabase } from './database'
import { percentile, runLoad, type LoadResult } from './load'
import { measureRoundTrips, paymentBody, type RoundTrips } from './round-trips'
import { seedKeys } from './seed'
import { BENCH_API_KEY, BENCH_TENANT, startService } from './service'

/** Seconds per measured round; two rounds of each kind, interleaved, so drift hits all kinds alike. */
const ROUND_SECONDS = Number(process.env.BENCH_ROUND_SECONDS ?? 5)
const ROUNDS = 2
/** Concurrent connections of the throughput rounds: twice the service's 16 work connections, so it is never idle. */
const CONNECTIONS = 32
/** The storm: 300 concurrent retries of one key (the issue's figure), sent 10 times over for stable percentiles. */
const STORM_CONNECTIONS = 300
const STORM_WAVES = 10
/** A provider call of 20 ms, typical of a card network's fast path, for the second comparison. */
const SLOW_PROVIDER_MS = 20
const SEED_KEYS = Number(process.env.BENCH_SEED_KEYS ?? 1_000_000)
const SCRAPES = 20
/** The purge is timed on at most this many rows (or seconds), enough for a steady rate. */
const PURGE_MAX_ROWS = 200_000
const PURGE_MAX_SECONDS = 10

const TARGETS = { freshVsBaseline: 0.6, replayVsFresh: 3, stormP99Ms: 10 }

const log = (line: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}`)
const round2 = (x: number) => Math.round(x * 100) / 100

async function main(): Promise<void> {
  const runStarted = performance.now()
  const loadBefore = loadAverage()
  const db = await freshDatabase(log)
  log(`database ${db.url.replace(/\/\/[^@]*@/, '//')} (PostgreSQL ${db.version})`)
  const sql = postgres(db.url, { max: 2, onnotice: () => undefined })
  try {
    log('counting database round trips per request (second service behind a wire-protocol counter)')
    const roundTrips = await measureRoundTrips(db.url)

    // METRICS_CACHE_MS=0: every scrape below queries the database (the default caches for 5 s).
    // BENCH_PROFILE=1: the service writes a CPU profile (Markdown) to .data/bench-profile/ when it stops.
    const profile = process.env.BENCH_PROFILE === '1' ? ['--cpu-prof-md', '--cpu-prof-dir=.data/bench-profile'] : []
    const service = await startService(db.url, { METRICS_CACHE_MS: '0' }, profile)
    try {
      const headers = { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json' }
      const load = (path: string, request: (n: number) => { body: string; key?: string | undefined }, extra: { connections?: number; durationS?: number; amount?: number } = {}) =>
        runLoad({ url: `${service.url}${path}`, connections: extra.connections ?? CONNECTIONS, headers, request, ...(extra.amount !== undefined ? { amount: extra.amount } : { durationS: extra.durationS ?? ROUND_SECONDS }) })
      const fresh = (prefix: string) => (n: number) => ({ body: JSON.stringify(paymentBody(n)), key: `${prefix}-${n}` })

      log('warm-up: fresh and baseline, 2 s each')
      await load('/api/payments', fresh('w'), { durationS: 2 })
      await load(BENCH_BASELINE_ROUTE, (n) => ({ body: JSON.stringify(paymentBody(n)) }), { durationS: 2 })
      // Replays replay the warm-up's keys: their bodies are paymentBody(n) for key w-n.
      const done = (await sql<{ key: string }[]>`select key from idempotency_keys where status = 'done' and key like 'w-%' limit 5000`).map((row) => Number(row.key.slice(2)))
      if (done.length === 0) throw new Error('the warm-up completed no payment')
      const replay = (n: number) => { const k = done[n % done.length]!; return { body: JSON.stringify(paymentBody(k)), key: `w-${k}` } }

      const runs: Record<'baseline' | 'fresh' | 'replay', LoadResult[]> = { baseline: [], fresh: [], replay: [] }
      for (let round = 1; round <= ROUNDS; round++) {
        log(`round ${round}/${ROUNDS}: baseline, fresh, replay, ${ROUND_SECONDS} s each`)
        runs.baseline.push(await load(BENCH_BASELINE_ROUTE, (n) => ({ body: JSON.stringify(paymentBody(n)) })))
        runs.fresh.push(await load('/api/payments', fresh(`f${round}`)))
        runs.replay.push(await load('/api/payments', replay))
      }
      // Exactly once under load: the replayed keys still have one payment each, however many replays.
      const replayed = (await sql<{ payments: number; keys: number }[]>`
        select count(*)::int as payments, count(distinct idempotency_key)::int as keys from payments where idempotency_key like 'w-%'`)[0]!
      const throughput = Object.fromEntries(Object.entries(runs).map(([kind, results]) => [kind, summarize(results)])) as Record<keyof typeof runs, Throughput>

      log(`storm: ${STORM_CONNECTIONS} concurrent retries of one in-flight key, ${STORM_WAVES} waves`)
      const storm = await runStorm(sql, service.url, (path, request, extra) => load(path, request, extra))

      log(`with a ${SLOW_PROVIDER_MS} ms provider (second service): baseline, fresh, ${ROUND_SECONDS} s each`)
      const slowProvider = await withSlowProvider(db.url, headers)

      log(`seeding ${SEED_KEYS.toLocaleString('en')} keys with generate_series`)
      const seedStarted = performance.now()
      await seedKeys(sql, SEED_KEYS)
      const seedSeconds = (performance.now() - seedStarted) / 1000
      const keys = (await sql<{ keys: number }[]>`select count(*)::int as keys from idempotency_keys`)[0]?.keys ?? 0
      log(`${keys.toLocaleString('en')} keys in the table (seeded in ${seedSeconds.toFixed(1)} s); scraping /metrics ${SCRAPES} times`)
      const scrape = await timeScrapes(service.url)

      log('purging completed keys past retention (core/purge.ts, as of a clock 2 days ahead)')
      const purge = await timePurge(sql)

      const results = {
        at: new Date().toISOString(),
        machine: { ...machine(db.version), loadBefore, loadAfter: loadAverage() },
        settings: { roundSeconds: ROUND_SECONDS, rounds: ROUNDS, connections: CONNECTIONS, stormConnections: STORM_CONNECTIONS, stormWaves: STORM_WAVES, seedKeys: SEED_KEYS },
        roundTrips,
        throughput,
        replayed,
        ratios: {
          freshVsBaseline: round2(throughput.fresh.rps / throughput.baseline.rps),
          replayVsFresh: round2(throughput.replay.rps / throughput.fresh.rps),
        },
        storm,
        slowProvider,
        scrape: { ...scrape, keys },
        purge,
        totalSeconds: Math.round((performance.now() - runStarted) / 1000),
      }
      mkdirSync('.data', { recursive: true })
      writeFileSync('.data/bench-last.json', JSON.stringify(results, null, 2))
      console.log(report(results))
    } finally {
      await service.stop()
    }
  } finally {
    await sql.end()
    await db.drop()
  }
}

interface Throughput {
  requests: number
  rps: number
  p50Ms: number
  p99Ms: number
  byStatus: Record<string, number>
  errors: number
}

/** Totals over the rounds of one kind: requests over seconds, percentiles over all answers. */
function summarize(results: LoadResult[]): Throughput {
  const requests = results.reduce((sum, r) => sum + r.requests, 0)
  const seconds = results.reduce((sum, r) => sum + r.seconds, 0)
  const all = results.flatMap((r) => [...r.latencies.values()].flat())
  const byStatus: Record<string, number> = {}
  for (const r of results) for (const [status, count] of Object.entries(r.byStatus)) byStatus[status] = (byStatus[status] ?? 0) + count
  return {
    requests,
    rps: Math.round(requests / seconds),
    p50Ms: round2(percentile(all, 50)),
    p99Ms: round2(percentile(all, 99)),
    byStatus,
    errors: results.reduce((sum, r) => sum + r.errors, 0),
  }
}

type Load = (path: string, request: (n: number) => { body: string; key?: string }, extra: { connections?: number; amount?: number; durationS?: number }) => Promise<LoadResult>

/**
 * A key in flight, exactly as a live worker leaves it: the processing row,
 * locked FOR UPDATE by an open transaction (lease.ts). Then 300 concurrent
 * retries of the same request, ten times over.
 */
async function runStorm(sql: postgres.Sql, baseUrl: string, load: Load) {
  const key = 'storm-key'
  const body = paymentBody(0)
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status)
    values (${BENCH_TENANT}, ${key}, 'POST', '/api/payments', ${fingerprint('POST', '/api/payments', body)}, 'processing')`
  const worker = await sql.reserve()
  try {
    await worker`begin`
    await worker`select 1 from idempotency_keys where tenant = ${BENCH_TENANT} and key = ${key} for update`
    const request = () => ({ body: JSON.stringify(body), key })
    const single = await load('/api/payments', request, { connections: STORM_CONNECTIONS, amount: STORM_CONNECTIONS })
    const sustained = await load('/api/payments', request, { connections: STORM_CONNECTIONS, amount: STORM_CONNECTIONS * STORM_WAVES })
    // The same retries, 32 at a time for a whole round (tens of thousands of answers, so one
    // scheduling hiccup does not make the p99): the 409's own latency, without a 300-deep queue.
    const before = await inProgressHistogram(baseUrl)
    const moderate = await load('/api/payments', request, { connections: CONNECTIONS, durationS: ROUND_SECONDS })
    const after = await inProgressHistogram(baseUrl)
    // The service's own timing of the same 409s (from handler start to answer, no socket queues):
    // which share it answered within 10 ms.
    const served = (after.get('+Inf') ?? 0) - (before.get('+Inf') ?? 0)
    const serverWithin10Ms = round2((((after.get('0.01') ?? 0) - (before.get('0.01') ?? 0)) / served) * 100)
    const stats = (result: LoadResult) => {
      const conflicts = result.latencies.get(409) ?? []
      return { requests: result.requests, answered409: conflicts.length, byStatus: result.byStatus, p50Ms: round2(percentile(conflicts, 50)), p99Ms: round2(percentile(conflicts, 99)), maxMs: round2(Math.max(...conflicts)) }
    }
    return { singleWave: stats(single), sustained: stats(sustained), moderate: { ...stats(moderate), serverWithin10Ms }, rps409: Math.round(sustained.rps) }
  } finally {
    await worker`rollback`
    worker.release()
  }
}

/**
 * Fresh vs baseline when the provider call takes SLOW_PROVIDER_MS, as real ones do. The
 * idempotent route holds its work connection (16 per process) through the call, since the key's
 * row lock is what shows its worker alive; the baseline calls the provider before taking one.
 */
async function withSlowProvider(databaseUrl: string, headers: Record<string, string>) {
  const service = await startService(databaseUrl, { PAYMENT_PROVIDER_DELAY_MS: String(SLOW_PROVIDER_MS) })
  try {
    const run = (path: string, request: (n: number) => { body: string; key?: string }) =>
      runLoad({ url: `${service.url}${path}`, connections: CONNECTIONS, durationS: ROUND_SECONDS, headers, request })
    const baseline = await run(BENCH_BASELINE_ROUTE, (n) => ({ body: JSON.stringify(paymentBody(n)) }))
    const fresh = await run('/api/payments', (n) => ({ body: JSON.stringify(paymentBody(n)), key: `slow-${n}` }))
    return { providerMs: SLOW_PROVIDER_MS, baseline: summarize([baseline]), fresh: summarize([fresh]), freshVsBaseline: round2(fresh.rps / baseline.rps) }
  } finally {
    await service.stop()
  }
}

/** Cumulative bucket counts (by `le`) of the service's idempotency_request_duration_seconds for 409 in_progress. */
async function inProgressHistogram(baseUrl: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${baseUrl}/metrics`)).text()
  const buckets = new Map<string, number>()
  for (const line of text.split('\n')) {
    if (!line.startsWith('idempotency_request_duration_seconds_bucket{') || !line.includes('outcome="in_progress"')) continue
    const le = /le="([^"]+)"/.exec(line)?.[1]
    if (le !== undefined) buckets.set(le, Number(line.split(' ').at(-1)))
  }
  return buckets
}

async function timeScrapes(baseUrl: string) {
  const times: number[] = []
  let bytes = 0
  let stale = Number.NaN
  for (let i = 0; i < SCRAPES; i++) {
    const started = performance.now()
    const response = await fetch(`${baseUrl}/metrics`)
    const text = await response.text()
    times.push(performance.now() - started)
    if (response.status !== 200) throw new Error(`/metrics answered ${response.status}`)
    bytes = text.length
    stale = text.split('\n').filter((line) => line.startsWith('idempotency_stale_processing_keys{')).reduce((sum, line) => sum + Number(line.split(' ').at(-1)), 0)
  }
  return { scrapes: SCRAPES, p50Ms: round2(percentile(times, 50)), maxMs: round2(Math.max(...times)), bytes, staleKeysReported: stale }
}

async function timePurge(sql: postgres.Sql) {
  const future = (await sql<{ future: Date }[]>`select now() + interval '2 days' as future`)[0]!.future
  const batchTimes: number[] = []
  let rows = 0
  const started = performance.now()
  while (rows < PURGE_MAX_ROWS && performance.now() - started < PURGE_MAX_SECONDS * 1000) {
    const batchStarted = performance.now()
    const deleted = await purgeExpired(sql, { retentionSeconds: 86_400, now: future, batchSize: PURGE_BATCH_SIZE })
    batchTimes.push(performance.now() - batchStarted)
    rows += deleted
    if (deleted < PURGE_BATCH_SIZE) break
  }
  const seconds = (performance.now() - started) / 1000
  const batchP50 = percentile(batchTimes, 50)
  return {
    rows,
    seconds: round2(seconds),
    batchSize: PURGE_BATCH_SIZE,
    batchP50Ms: round2(batchP50),
    batchP99Ms: round2(percentile(batchTimes, 99)),
    /** Back to back, as fast as the database deletes. */
    rowsPerSecond: Math.round(rows / seconds),
    /** With the production pause between batches (retention-purge.ts): what a backlog drains at. */
    pacedRowsPerSecond: Math.round(PURGE_BATCH_SIZE / ((batchP50 + PURGE_PAUSE_MS) / 1000)),
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

function report(r: {
  machine: ReturnType<typeof machine> & { loadBefore: number; loadAfter: number }
  roundTrips: RoundTrips
  throughput: Record<'baseline' | 'fresh' | 'replay', Throughput>
  replayed: { payments: number; keys: number }
  ratios: { freshVsBaseline: number; replayVsFresh: number }
  storm: Awaited<ReturnType<typeof runStorm>>
  slowProvider: Awaited<ReturnType<typeof withSlowProvider>>
  scrape: Awaited<ReturnType<typeof timeScrapes>> & { keys: number }
  purge: Awaited<ReturnType<typeof timePurge>>
  totalSeconds: number
}): string {
  const verdict = (ok: boolean) => (ok ? 'met' : '**not met**')
  const t = r.throughput
  const lines = [
    `## Results (${new Date().toISOString().slice(0, 16)}Z, run took ${r.totalSeconds} s)`,
    '',
    `Machine: ${r.machine.nproc} CPU (${r.machine.cpu}), PostgreSQL ${r.machine.postgres}, Bun ${r.machine.bun}, ${r.machine.os}; load generator, service and database on the same machine; 1-minute load average ${r.machine.loadBefore} before the run, ${r.machine.loadAfter} after.`,
    '',
    '| figure | measured | target | |',
    '| --- | --- | --- | --- |',
    `| fresh / non-idempotent insert | **${r.ratios.freshVsBaseline}×** (${t.fresh.rps} vs ${t.baseline.rps} req/s) | ≥ ${TARGETS.freshVsBaseline}× | ${verdict(r.ratios.freshVsBaseline >= TARGETS.freshVsBaseline)} |`,
    `| replay / fresh | **${r.ratios.replayVsFresh}×** (${t.replay.rps} vs ${t.fresh.rps} req/s) | ≥ ${TARGETS.replayVsFresh}× | ${verdict(r.ratios.replayVsFresh >= TARGETS.replayVsFresh)} |`,
    `| 409 storm, 300 concurrent retries × ${STORM_WAVES}: p50 / p99 | ${r.storm.sustained.p50Ms} / **${r.storm.sustained.p99Ms} ms** | p99 ≤ ${TARGETS.stormP99Ms} ms | ${verdict(r.storm.sustained.p99Ms <= TARGETS.stormP99Ms)} |`,
    `| 409 storm, one wave of 300: p50 / p99 | ${r.storm.singleWave.p50Ms} / ${r.storm.singleWave.p99Ms} ms | p99 ≤ ${TARGETS.stormP99Ms} ms | ${verdict(r.storm.singleWave.p99Ms <= TARGETS.stormP99Ms)} |`,
    `| 409s, retries of the same key 32 at a time for ${ROUND_SECONDS} s (${r.storm.moderate.answered409} answers): p50 / p99 | ${r.storm.moderate.p50Ms} / ${r.storm.moderate.p99Ms} ms (the service's own histogram: ${r.storm.moderate.serverWithin10Ms}% within 10 ms) | p99 ≤ ${TARGETS.stormP99Ms} ms | ${verdict(r.storm.moderate.p99Ms <= TARGETS.stormP99Ms)} |`,
    `| fresh / non-idempotent insert, ${r.slowProvider.providerMs} ms provider | ${r.slowProvider.freshVsBaseline}× (${r.slowProvider.fresh.rps} vs ${r.slowProvider.baseline.rps} req/s) | ≥ ${TARGETS.freshVsBaseline}× | ${verdict(r.slowProvider.freshVsBaseline >= TARGETS.freshVsBaseline)} |`,
    `| /metrics scrape, ${r.scrape.keys.toLocaleString('en')} keys (cache off) | p50 ${r.scrape.p50Ms} ms, max ${r.scrape.maxMs} ms | | |`,
    `| purge (batches of ${r.purge.batchSize}) | ${r.purge.rowsPerSecond.toLocaleString('en')} rows/s back to back; ${r.purge.pacedRowsPerSecond.toLocaleString('en')} rows/s with the ${PURGE_PAUSE_MS} ms production pause (batch p50 ${r.purge.batchP50Ms} ms) | | |`,
    '',
    `Exactly once under load: after ${t.replay.requests} replays of the warm-up's keys, ${r.replayed.keys} keys have ${r.replayed.payments} payments${r.replayed.payments === r.replayed.keys ? ' (one each)' : ' (**DUPLICATES**)'}.`,
    '',
    '| kind | req/s | p50 ms | p99 ms | answers |',
    '| --- | --- | --- | --- | --- |',
    ...(['baseline', 'fresh', 'replay'] as const).map((kind) => `| ${kind} | ${t[kind].rps} | ${t[kind].p50Ms} | ${t[kind].p99Ms} | ${Object.entries(t[kind].byStatus).map(([s, n]) => `${s}: ${n}`).join(', ')}${t[kind].errors ? `, errors: ${t[kind].errors}` : ''} |`),
    `| storm (409, 300 connections) | ${r.storm.rps409} | ${r.storm.sustained.p50Ms} | ${r.storm.sustained.p99Ms} | ${Object.entries(r.storm.sustained.byStatus).map(([s, n]) => `${s}: ${n}`).join(', ')} |`,
    '',
    'Database round trips (statements) per request, counted on the wire:',
    '',
    '| request | round trips | statements |',
    '| --- | --- | --- |',
    ...(['fresh', 'replay', 'inProgress', 'baseline'] as const).map((kind) => `| ${kind} | ${r.roundTrips[kind].roundTrips} | ${r.roundTrips[kind].statements} |`),
  ]
  return lines.join('\n')
}

await main()
