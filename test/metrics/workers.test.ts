import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { waitFor, waitForClaims } from '../support/wait'
import { sample } from './factories'

/**
 * WORKERS=2: two processes behind one port, a scrape reaches one of them at
 * random. Each scrape must still show the whole service's counters.
 */
const REQUESTS = 30

let db: TestDatabase
let provider: GatedProvider
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('metrics_workers')
  provider = await startGatedProvider()
  server = await startServer(db.url, { WORKERS: '2', METRICS_CACHE_MS: '0' }, { provider })
  // Both workers must be listening before the traffic starts.
  await waitFor(() => listeningPids().length >= 2, 'both workers listening', 20_000)
}, 60_000)
afterAll(async () => {
  await server?.stop()
  await provider?.stop()
  await db?.drop()
}, 30_000)

/** The pids of the workers' "listening on" lines, in order (a restarted worker adds one). */
function listeningPids(): number[] {
  return [...server.output().matchAll(/listening on \S+ \(pid (\d+)\)/g)].map((m) => Number(m[1]))
}

/** A new connection per request, so the kernel spreads them over the workers. */
const fresh = { headers: { connection: 'close' } }

async function scrape(): Promise<string> {
  const response = await fetch(`${server.url}/metrics`, fresh)
  expect(response.status).toBe(200)
  return response.text()
}

test('every scrape shows the sum over all workers, whichever worker answers it', async () => {
  // The charges wait at the provider until every payment is claimed, so that
  // each claim, still in processing, names the process that took it.
  provider.hold()
  const keys = Array.from({ length: REQUESTS }, (_, i) => `workers-${i}-${crypto.randomUUID()}`)
  const posted = keys.map((key, i) => postPayment(server.url, payment({ amount: 100 + i }), { key, ...fresh }))
  await waitForClaims(db.sql, keys)
  // Both workers served payments: a claim records its process (owner), whose heartbeat row has its pid.
  const claimedBy = await db.sql<{ pid: number }[]>`
    select distinct p.pid from idempotency_key_states k join idempotency_processes p on p.id = k.owner
     where k.tenant = 'acme' and k.key in ${db.sql(keys)}`
  const workers = claimedBy.length
  expect(workers).toBe(2)
  expect(claimedBy.map((row) => row.pid).sort()).toEqual(listeningPids().sort())
  provider.release()
  for (const response of await Promise.all(posted)) expect(response.status).toBe(201)

  for (let i = 0; i < 8; i++) {
    const text = await scrape()
    expect(sample(text, 'idempotency_requests_total', { route: '/api/payments', outcome: 'created' })).toBe(REQUESTS)
    expect(sample(text, 'http_requests_total', { method: 'POST', route: '/api/payments', status: '201' })).toBe(REQUESTS)
    expect(sample(text, 'http_request_duration_seconds_count', { method: 'POST', route: '/api/payments', status: '201' })).toBe(REQUESTS)
    // the database gauges are global: once, not once per worker, and not summed
    expect(text.match(/^idempotency_stale_processing_keys\{tenant="acme"\} /gm)?.length).toBe(1)
    expect(sample(text, 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(0)
    // the TTL is each worker's same setting: its value, never the sum over the workers (60)
    expect(sample(text, 'idempotency_ttl_seconds')).toBe(30)
    expect(sample(text, 'idempotency_ready')).toBe(1)
  }
}, 60_000)

test('a worker that dies and is restarted does not make the counters go back', async () => {
  const pids = /started 2 workers: (\d+), (\d+)/.exec(server.output())
  expect(pids).not.toBeNull()
  const before = sample(await scrape(), 'idempotency_requests_total', { route: '/api/payments', outcome: 'created' })!
  process.kill(Number(pids![1]), 'SIGKILL')
  await waitFor(() => (server.output().match(/listening on/g) ?? []).length >= 3, 'the supervisor to restart the killed worker', 20_000)
  expect((server.output().match(/listening on/g) ?? []).length).toBe(3) // restarted by the supervisor
  for (let i = 0; i < 6; i++)
    expect(sample(await scrape(), 'idempotency_requests_total', { route: '/api/payments', outcome: 'created' })).toBeGreaterThanOrEqual(before)
}, 60_000)
