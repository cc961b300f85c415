import postgres from 'postgres'
import { fingerprint } from '../src/core/fingerprint'
import { startRoundTripCounter, type Counts } from './pg-round-trips'
import { BENCH_API_KEY, BENCH_TENANT, startService } from './service'

export interface RoundTrips {
  readonly fresh: Counts
  readonly replay: Counts
  readonly inProgress: Counts
  readonly baseline: Counts
}

/** Requests per measured kind: enough that a stray background statement moves the mean by < 0.01. */
const SAMPLES = 200
const WARMUP = 30

export const paymentBody = (n: number) => ({ amount: 1000 + (n % 997), currency: 'EUR', customer: `cus_${n % 1000}` })

/**
 * Database round trips and statements per request, counted on the wire by a
 * proxy between a second service process and PostgreSQL. Requests are sent
 * one at a time, so each request's statements are its own.
 */
export async function measureRoundTrips(databaseUrl: string, providerUrl: string): Promise<RoundTrips> {
  const counter = await startRoundTripCounter(databaseUrl)
  const service = await startService(counter.url, providerUrl)
  const sql = postgres(databaseUrl, { max: 1, onnotice: () => undefined })
  const post = (path: string, key: string | undefined, n: number) => fetch(`${service.url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
    body: JSON.stringify(paymentBody(n)),
  }).then(async (response) => {
    await response.arrayBuffer()
    return response.status
  })
  async function measure(count: number, send: (i: number) => Promise<number>, expected: number): Promise<Counts> {
    const before = counter.snapshot()
    for (let i = 0; i < count; i++) {
      const status = await send(i)
      if (status !== expected) throw new Error(`round-trip count: expected ${expected}, got ${status}; the service said:\n${service.output().slice(-2000)}`)
    }
    const after = counter.snapshot()
    const per = (field: keyof Counts) => Math.round(((after[field] - before[field]) / count) * 100) / 100
    return { statements: per('statements'), roundTrips: per('roundTrips'), describes: per('describes') }
  }
  try {
    const key = (kind: string, i: number) => `rt-${kind}-${i}`
    // Warm up every connection's prepared statements, so describes drop out.
    await measure(WARMUP, (i) => post('/api/payments', key('warm', i), i), 201)
    await measure(WARMUP, (i) => post('/api/payments', key('warm', i), i), 201)
    await measure(WARMUP, (i) => post('/bench/payments-baseline', undefined, i), 201)
    const fresh = await measure(SAMPLES, (i) => post('/api/payments', key('fresh', i), i), 201)
    const replay = await measure(SAMPLES, (i) => post('/api/payments', key('fresh', i), i), 201)
    const baseline = await measure(SAMPLES, (i) => post('/bench/payments-baseline', undefined, i), 201)
    // A key in flight: a processing row, as a live worker leaves it (it holds no lock while it acts).
    const busy = 'rt-busy'
    await sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status)
      values (${BENCH_TENANT}, ${busy}, 'POST', '/api/payments', ${fingerprint('POST', '/api/payments', paymentBody(0))}, 'processing')`
    const inProgress = await measure(SAMPLES, () => post('/api/payments', busy, 0), 409)
    return { fresh, replay, inProgress, baseline }
  } finally {
    await sql.end()
    await service.stop()
    counter.stop()
  }
}

if (import.meta.main) {
  const { freshDatabase } = await import('./database')
  const { startProvider } = await import('./provider')
  const db = await freshDatabase(() => undefined)
  const provider = await startProvider(0)
  try {
    console.log(await measureRoundTrips(db.url, provider.url))
  } finally {
    await provider.stop()
    await db.drop()
  }
}
