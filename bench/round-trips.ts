import { loadavg } from 'node:os'
import postgres from 'postgres'
import { runLoad } from './load'
import { difference, startRoundTripCounter, type Counts } from './pg-round-trips'
import { insertInFlightKey } from './seed'
import { NAIVE_API_KEY, startNaiveApp } from './naive-process'
import { BENCH_API_KEY, BENCH_TENANT, startService } from './service'

/** What one request costs on the wire, per request (means over the requests of a kind). */
export interface WireCost {
  readonly requests: number
  readonly statements: number
  readonly roundTrips: number
  readonly describes: number
  /** Transactions ended (each autocommit statement is one, BEGIN ... COMMIT one). */
  readonly transactions: number
  /** Of those, the ones with a statement mentioning INSERT, UPDATE or DELETE: a WAL flush each. */
  readonly writingTransactions: number
  readonly commits: number
  /** Statements that claim a key (isClaim), and the round trips they started. */
  readonly claimStatements: number
  readonly claimRoundTrips: number
  /** Requests per claim round trip: above 1 when one round trip serves several claims (batching, or pipelining). */
  readonly claimsPerRoundTrip: number
  /** Per statement text, per request, most frequent first. */
  readonly byText: readonly { text: string; statements: number; roundTrips: number }[]
  /** 1-minute load average when the kind was measured. */
  readonly loadAverage: number
}

export interface RoundTrips {
  /** One request at a time. */
  readonly sequential: {
    readonly fresh: WireCost
    readonly replay: WireCost
    readonly inProgress: WireCost
    readonly baseline: WireCost
    readonly naive: WireCost
    readonly naiveReplay: WireCost
  }
  /** `connections` requests at a time: where batching (or postgres.js's pipelining) can serve several requests per round trip. */
  readonly concurrent: { readonly connections: number; readonly fresh: WireCost; readonly naive: WireCost }
}

/** Requests per sequential kind: enough that a stray background statement moves the mean by < 0.01. */
const SAMPLES = 200
const WARMUP = 30

/**
 * Which statements are claims, by their text. The engine's claim inserts into
 * its key (or claims) table; the heartbeat, settings and audit tables are not
 * claims, and neither is a completion that inserts the payment. Update this
 * with the engine's SQL if it changes shape: the per-text table of the report
 * shows what is sent either way.
 */
export function isClaim(text: string): boolean {
  if (/insert\s+into\s+"?payments\b/i.test(text)) return false
  return /insert\s+into\s+"?idempotency_(?!processes|settings|audit)\w+/i.test(text) || /\bidempotency_claim\w*\s*\(/i.test(text)
}

export const paymentBody = (n: number) => ({ amount: 1000 + (n % 997), currency: 'EUR', customer: `cus_${n % 1000}` })

const round2 = (x: number) => Math.round(x * 100) / 100

export function wireCost(counts: Counts, requests: number): WireCost {
  const per = (x: number) => round2(x / requests)
  let claimStatements = 0
  let claimRoundTrips = 0
  for (const [text, c] of Object.entries(counts.byText)) {
    if (!isClaim(text)) continue
    claimStatements += c.statements
    claimRoundTrips += c.roundTrips
  }
  return {
    requests,
    statements: per(counts.statements),
    roundTrips: per(counts.roundTrips),
    describes: per(counts.describes),
    transactions: per(counts.transactions),
    writingTransactions: per(counts.writingTransactions),
    commits: per(counts.commits),
    claimStatements: per(claimStatements),
    claimRoundTrips: per(claimRoundTrips),
    claimsPerRoundTrip: claimRoundTrips > 0 ? round2(requests / claimRoundTrips) : Number.NaN,
    byText: Object.entries(counts.byText)
      .map(([text, c]) => ({ text, statements: per(c.statements), roundTrips: per(c.roundTrips) }))
      .filter((t) => t.statements >= 0.01)
      .sort((a, b) => b.statements - a.statements),
    loadAverage: round2(loadavg()[0]!),
  }
}

/**
 * Database round trips and statements per request, counted on the wire by a
 * proxy between a service process of its own and PostgreSQL: one request at
 * a time (each request's statements are its own), then `connections` at a
 * time (how many requests one round trip serves).
 */
export async function measureRoundTrips(databaseUrl: string, providerUrl: string, concurrent: { connections: number; requests: number }): Promise<RoundTrips> {
  // The service and the naive app (bench/naive-app.ts), each behind a counter of its own.
  const counter = await startRoundTripCounter(databaseUrl)
  const naiveCounter = await startRoundTripCounter(databaseUrl)
  const service = await startService(counter.url, providerUrl)
  const naiveApp = await startNaiveApp(naiveCounter.url, providerUrl)
  const sql = postgres(databaseUrl, { max: 1, onnotice: () => undefined })
  const BASELINE = 'naive:/baseline'
  const NAIVE = 'naive:/payments'
  const target = (path: string) => path.startsWith('naive:')
    ? { url: `${naiveApp.url}${path.slice('naive:'.length)}`, counter: naiveCounter, key: NAIVE_API_KEY }
    : { url: `${service.url}${path}`, counter, key: BENCH_API_KEY }
  const post = (path: string, key: string | undefined, n: number) => fetch(target(path).url, {
    method: 'POST',
    headers: { authorization: `Bearer ${target(path).key}`, 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
    body: JSON.stringify(paymentBody(n)),
  }).then(async (response) => {
    await response.arrayBuffer()
    return response.status
  })
  async function measure(count: number, path: string, send: (i: number) => Promise<number>, expected: number): Promise<WireCost> {
    const { counter: counted } = target(path)
    const before = counted.snapshot()
    for (let i = 0; i < count; i++) {
      const status = await send(i)
      if (status !== expected) throw new Error(`round-trip count on ${path}: expected ${expected}, got ${status}; the service said:\n${service.output().slice(-2000)}\nthe naive app:\n${naiveApp.output().slice(-1000)}`)
    }
    return wireCost(difference(counted.snapshot(), before), count)
  }
  async function measureConcurrent(path: string, prefix: string, requests: number): Promise<WireCost> {
    const { url, counter: counted, key: apiKey } = target(path)
    const before = counted.snapshot()
    const result = await runLoad({
      url, connections: concurrent.connections, amount: requests, headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      request: (n) => ({ body: JSON.stringify(paymentBody(n)), key: `${prefix}-${n}` }),
    })
    const counts = difference(counted.snapshot(), before)
    if ((result.byStatus['201'] ?? 0) !== result.requests) throw new Error(`round-trip count at ${concurrent.connections} connections on ${path}: ${JSON.stringify(result.byStatus)}`)
    return wireCost(counts, result.requests)
  }
  try {
    const key = (kind: string, i: number) => `rt-${kind}-${i}`
    // Warm up every connection's prepared statements, so describes drop out (the naive route also makes its table here).
    await measure(WARMUP, '/api/payments', (i) => post('/api/payments', key('warm', i), i), 201)
    await measure(WARMUP, '/api/payments', (i) => post('/api/payments', key('warm', i), i), 201)
    await measure(WARMUP, BASELINE, (i) => post(BASELINE, undefined, i), 201)
    await measure(WARMUP, NAIVE, (i) => post(NAIVE, `naive-${key('warm', i)}`, i), 201)
    await measure(WARMUP, NAIVE, (i) => post(NAIVE, `naive-${key('warm', i)}`, i), 201)
    const fresh = await measure(SAMPLES, '/api/payments', (i) => post('/api/payments', key('fresh', i), i), 201)
    const replay = await measure(SAMPLES, '/api/payments', (i) => post('/api/payments', key('fresh', i), i), 201)
    const baseline = await measure(SAMPLES, BASELINE, (i) => post(BASELINE, undefined, i), 201)
    const naive = await measure(SAMPLES, NAIVE, (i) => post(NAIVE, `naive-${key('fresh', i)}`, i), 201)
    const naiveReplay = await measure(SAMPLES, NAIVE, (i) => post(NAIVE, `naive-${key('fresh', i)}`, i), 201)
    const busy = 'rt-busy'
    await insertInFlightKey(sql, BENCH_TENANT, busy, '/api/payments', paymentBody(0))
    const inProgress = await measure(SAMPLES, '/api/payments', () => post('/api/payments', busy, 0), 409)

    // Concurrent: warm every pool connection first (the pools open lazily), then count.
    const many = Math.max(concurrent.connections * 4, 200)
    await measureConcurrent('/api/payments', 'rt-cwarm', many)
    await measureConcurrent(NAIVE, 'naive-rt-cwarm', many)
    const concurrentFresh = await measureConcurrent('/api/payments', 'rt-c', concurrent.requests)
    const concurrentNaive = await measureConcurrent(NAIVE, 'naive-rt-c', concurrent.requests)
    return {
      sequential: { fresh, replay, inProgress, baseline, naive, naiveReplay },
      concurrent: { connections: concurrent.connections, fresh: concurrentFresh, naive: concurrentNaive },
    }
  } finally {
    await sql.end()
    await service.stop()
    await naiveApp.stop()
    counter.stop()
    naiveCounter.stop()
  }
}

if (import.meta.main) {
  const { freshDatabase } = await import('./database')
  const { startProvider } = await import('./provider')
  const db = await freshDatabase(() => undefined)
  const provider = await startProvider(0)
  try {
    const connections = Number(process.env.BENCH_RT_CONNECTIONS ?? 32)
    const requests = Number(process.env.BENCH_RT_REQUESTS ?? 2000)
    console.log(JSON.stringify(await measureRoundTrips(db.url, provider.url, { connections, requests }), null, 2))
  } finally {
    await provider.stop()
    await db.drop()
  }
}
