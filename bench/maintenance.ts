import type postgres from 'postgres'
import { purgeExpired, PURGE_BATCH_SIZE } from '../src/core/purge'
import { purgePauseMs } from '../src/maintenance/retention-purge'
import { percentile, round2 } from './load'
import { BENCH_METRICS_TOKEN } from './service'

/** Scrapes of /metrics timed with the gauge cache off. */
export const SCRAPES = 20
/** The purge is timed on at most this many rows (or seconds), enough for a steady rate. */
const PURGE_MAX_ROWS = 200_000
const PURGE_MAX_SECONDS = 10

/** Times SCRAPES scrapes of /metrics (the service runs with METRICS_CACHE_MS=0, so each one queries the database). */
export async function timeScrapes(baseUrl: string) {
  const times: number[] = []
  let bytes = 0
  let stale = Number.NaN
  for (let i = 0; i < SCRAPES; i++) {
    const started = performance.now()
    const response = await fetch(`${baseUrl}/metrics`, { headers: { authorization: `Bearer ${BENCH_METRICS_TOKEN}` } })
    const text = await response.text()
    times.push(performance.now() - started)
    if (response.status !== 200) throw new Error(`/metrics answered ${response.status}`)
    bytes = text.length
    stale = text.split('\n').filter((line) => line.startsWith('idempotency_stale_processing_keys{')).reduce((sum, line) => sum + Number(line.split(' ').at(-1)), 0)
  }
  return { scrapes: SCRAPES, p50Ms: round2(percentile(times, 50)), maxMs: round2(Math.max(...times)), bytes, staleKeysReported: stale }
}

/** purgeExpired (core/purge.ts) back to back, as of a clock two days ahead, so every seeded key is past retention. */
export async function timePurge(sql: postgres.Sql) {
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
    pauseMs: Math.round(purgePauseMs(batchP50) * 100) / 100,
    batchP50Ms: round2(batchP50),
    batchP99Ms: round2(percentile(batchTimes, 99)),
    /** Back to back, as fast as the database deletes. */
    rowsPerSecond: Math.round(rows / seconds),
    /** With the production pause between batches (retention-purge.ts, after a batch of the median time): what a backlog drains at. */
    pacedRowsPerSecond: Math.round(PURGE_BATCH_SIZE / ((batchP50 + purgePauseMs(batchP50)) / 1000)),
  }
}
