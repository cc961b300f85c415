import type postgres from 'postgres'
import { percentile, round2, type CpuTotals, type LoadResult } from './load'
import { paymentBody } from './round-trips'
import { insertInFlightKey, keepInFlightKeyYoung } from './seed'
import { BENCH_METRICS_TOKEN, BENCH_TENANT } from './service'

/** The storm: 300 concurrent retries of one key (the figure of the original issue), sent 10 times over for stable percentiles. */
export const STORM_CONNECTIONS = 300
export const STORM_WAVES = 10

export type Load = (
  path: string,
  request: (n: number) => { body: string; key?: string },
  extra: { connections?: number; amount?: number; durationS?: number },
) => Promise<LoadResult>

/** The in-flight key a storm retries, and how to keep it in flight. */
export interface InFlightKey {
  readonly key: string
  readonly body: ReturnType<typeof paymentBody>
  /** Called before each phase: keeps the key from turning stale (reclaimable). */
  readonly young: () => Promise<void>
}

/**
 * A key another process is running, as a live worker there leaves it (a
 * `processing` row, young, no lock: atomic phases hold nothing across the
 * foreign call), made by seed.ts: every retry is answered by the claim
 * statement. The key is made young again before each phase, so it never
 * grows stale on a slow machine.
 */
export async function keyRunElsewhere(sql: postgres.Sql): Promise<InFlightKey> {
  const key = 'storm-key'
  const body = paymentBody(0)
  await insertInFlightKey(sql, BENCH_TENANT, key, '/api/payments', body)
  return { key, body, young: () => keepInFlightKeyYoung(sql, BENCH_TENANT, key) }
}

/**
 * A key the service under load is running itself: a real request, held at a
 * provider that does not answer until `release` (then it refuses, so nothing
 * is charged and the key is released). Its retries on the same process are
 * answered from memory (src/http/running-keys.ts) until the run's deadline,
 * TTL minus a tenth: the phases take seconds, well inside it.
 */
export async function keyRunHere(sql: postgres.Sql, baseUrl: string, headers: Record<string, string>): Promise<InFlightKey & { readonly answered: Promise<number> }> {
  const key = 'storm-key-here'
  const body = paymentBody(1)
  const answered = fetch(`${baseUrl}/api/payments`, { method: 'POST', headers: { ...headers, 'idempotency-key': key }, body: JSON.stringify(body) })
    .then(async (response) => { await response.arrayBuffer(); return response.status }, () => 0)
  const deadline = Date.now() + 10_000
  while (Date.now() < deadline) {
    const [row] = await sql<{ status: string }[]>`select status from idempotency_key_states where tenant = ${BENCH_TENANT} and key = ${key}`
    if (row?.status === 'processing') return { key, body, young: async () => undefined, answered }
    await Bun.sleep(10)
  }
  throw new Error(`the held request for ${key} did not claim its key within 10 s`)
}

/**
 * Retries of an in-flight key: one wave of 300 at once, ten waves back to
 * back on 300 connections, and 32 at a time for `moderateSeconds`.
 */
export async function runStorm(
  baseUrl: string, load: Load, inFlight: InFlightKey,
  moderate: { connections: number; seconds: number; measure: (work: () => Promise<LoadResult>) => Promise<{ result: LoadResult; cpu: CpuTotals }> },
) {
  const { key, body, young } = inFlight
  const request = () => ({ body: JSON.stringify(body), key })
  await young()
  const single = await load('/api/payments', request, { connections: STORM_CONNECTIONS, amount: STORM_CONNECTIONS })
  await young()
  const sustained = await load('/api/payments', request, { connections: STORM_CONNECTIONS, amount: STORM_CONNECTIONS * STORM_WAVES })
  // The same retries, 32 at a time for a whole round (tens of thousands of answers, so one
  // scheduling hiccup does not make the p99): the 409's own latency, without a 300-deep queue.
  await young()
  const before = await inProgressHistogram(baseUrl)
  const { result: steady, cpu } = await moderate.measure(() => load('/api/payments', request, { connections: moderate.connections, durationS: moderate.seconds }))
  const after = await inProgressHistogram(baseUrl)
  // The service's own timing of the same 409s (from handler start to answer, no socket queues).
  const served = (after.get('+Inf') ?? 0) - (before.get('+Inf') ?? 0)
  const serverWithin10Ms = round2((((after.get('0.01') ?? 0) - (before.get('0.01') ?? 0)) / served) * 100)
  const stats = (result: LoadResult) => {
    const conflicts = result.latencies.get(409) ?? []
    return {
      requests: result.requests,
      answered409: conflicts.length,
      rps: Math.round(result.rps),
      byStatus: result.byStatus,
      p50Ms: round2(percentile(conflicts, 50)),
      p99Ms: round2(percentile(conflicts, 99)),
      maxMs: round2(Math.max(...conflicts)),
    }
  }
  const perAnswer = (us: number) => Math.round(us / Math.max(1, steady.requests))
  return {
    singleWave: stats(single),
    sustained: stats(sustained),
    moderate: { ...stats(steady), serverWithin10Ms, cpuUs: { service: perAnswer(cpu.serviceUs), postgres: perAnswer(cpu.postgresUs), loadGenerator: perAnswer(cpu.loadGeneratorUs) }, machineBusyPercent: Math.round(cpu.machineBusyShare * 100) },
  }
}

/** Cumulative bucket counts (by `le`) of the service's idempotency_request_duration_seconds for 409 in_progress. */
async function inProgressHistogram(baseUrl: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${baseUrl}/metrics`, { headers: { authorization: `Bearer ${BENCH_METRICS_TOKEN}` } })).text()
  const buckets = new Map<string, number>()
  for (const line of text.split('\n')) {
    if (!line.startsWith('idempotency_request_duration_seconds_bucket{') || !line.includes('outcome="in_progress"')) continue
    const le = /le="([^"]+)"/.exec(line)?.[1]
    if (le !== undefined) buckets.set(le, Number(line.split(' ').at(-1)))
  }
  return buckets
}
