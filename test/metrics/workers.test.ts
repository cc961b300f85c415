import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startServer, type ServerProcess } from '../support/server'
import { sample } from './factories'

/**
 * WORKERS=2: two processes behind one port, a scrape reaches one of them at
 * random. Each scrape must still show the whole service's counters.
 */
const REQUESTS = 30

let db: TestDatabase
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('metrics_workers')
  server = await startServer(db.url, { WORKERS: '2', METRICS_CACHE_MS: '0' })
  // Both workers must be listening before the traffic starts.
  for (let i = 0; i < 200 && (server.output().match(/listening on/g) ?? []).length < 2; i++) await Bun.sleep(25)
}, 60_000)
afterAll(async () => {
  await server?.stop()
  await db?.drop()
}, 30_000)

/** A new connection per request, so the kernel spreads them over the workers. */
const fresh = { headers: { connection: 'close' } }

async function scrape(): Promise<string> {
  const response = await fetch(`${server.url}/metrics`, fresh)
  expect(response.status).toBe(200)
  return response.text()
}

test('every scrape shows the sum over all workers, whichever worker answers it', async () => {
  for (let i = 0; i < REQUESTS; i++)
    expect((await postPayment(server.url, payment({ amount: 100 + i }), fresh)).status).toBe(201)
  // Both workers served payments: each opened connections under its own pid.
  const [{ workers }] = await db.sql<{ workers: number }[]>`
    select count(distinct split_part(application_name, ':', 2))::int as workers
      from pg_stat_activity where datname = current_database() and application_name like 'idempotent-post:%'` as unknown as [{ workers: number }]
  expect(workers).toBe(2)

  for (let i = 0; i < 8; i++) {
    const text = await scrape()
    expect(sample(text, 'idempotency_requests_total', { route: '/api/payments', outcome: 'created' })).toBe(REQUESTS)
    expect(sample(text, 'http_requests_total', { method: 'POST', route: '/api/payments', status: '201' })).toBe(REQUESTS)
    expect(sample(text, 'http_request_duration_seconds_count', { method: 'POST', route: '/api/payments', status: '201' })).toBe(REQUESTS)
    // the database gauges are global: once, not once per worker, and not summed
    expect(text.match(/^idempotency_stale_processing_keys\{tenant="acme"\} /gm)?.length).toBe(1)
    expect(sample(text, 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(0)
  }
}, 60_000)

test('a worker that dies and is restarted does not make the counters go back', async () => {
  const pids = /started 2 workers: (\d+), (\d+)/.exec(server.output())
  expect(pids).not.toBeNull()
  const before = sample(await scrape(), 'idempotency_requests_total', { route: '/api/payments', outcome: 'created' })!
  process.kill(Number(pids![1]), 'SIGKILL')
  for (let i = 0; i < 200 && (server.output().match(/listening on/g) ?? []).length < 3; i++) await Bun.sleep(25)
  expect((server.output().match(/listening on/g) ?? []).length).toBe(3) // restarted by the supervisor
  for (let i = 0; i < 6; i++)
    expect(sample(await scrape(), 'idempotency_requests_total', { route: '/api/payments', outcome: 'created' })).toBeGreaterThanOrEqual(before)
}, 60_000)
