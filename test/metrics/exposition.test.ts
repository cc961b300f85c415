import { afterAll, beforeAll, expect, test } from 'bun:test'
import { UNSUPPORTED_UNDER_BUN } from '../../src/metrics/process'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { createKey, deleteKeys, fingerprintOf, identity } from '../support/keys'
import { startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { waitForClaims } from '../support/wait'
import { sample } from './factories'

let db: TestDatabase
/** Holds a charge while a retry gets its 409. */
let provider: GatedProvider
let server: ServerProcess
let exposition: string

beforeAll(async () => {
  db = await createTestDatabase('exposition')
  provider = await startGatedProvider()
  server = await startServer(db.url, { METRICS_CACHE_MS: '0' }, { provider })

  const key = crypto.randomUUID()
  expect((await postPayment(server.url, payment(), { key })).status).toBe(201)
  expect((await postPayment(server.url, payment(), { key })).status).toBe(201) // replay
  expect((await postPayment(server.url, payment({ amount: 1 }), { key })).status).toBe(422)
  expect((await postPayment(server.url, { amount: 'lots' })).status).toBe(400)
  expect((await postPayment(server.url, payment(), { key: null })).status).toBe(400)
  expect((await postPayment(server.url, payment(), { apiKey: null })).status).toBe(401)
  expect((await postPayment(server.url, 'amount=1', { contentType: 'text/plain' })).status).toBe(415)

  const slow = crypto.randomUUID()
  provider.hold(1)
  const first = postPayment(server.url, payment({ customer: 'slow' }), { key: slow })
  await waitForClaims(db.sql, [slow])
  expect((await postPayment(server.url, payment({ customer: 'slow' }), { key: slow })).status).toBe(409)
  provider.release()
  expect((await first).status).toBe(201)

  // A client that makes a new key per retry: the same request completes twice.
  for (let i = 0; i < 2; i++)
    expect((await postPayment(server.url, payment({ customer: 'retries-with-new-keys' }), { key: crypto.randomUUID() })).status).toBe(201)
  // A key stranded by a dead worker, long past the TTL.
  await createKey(db.sql, identity({ tenant: 'globex', fingerprint: fingerprintOf('stranded') }), { status: 'processing', lockedAt: new Date(Date.now() - 10 * 60_000) })

  const response = await fetch(`${server.url}/metrics`)
  expect(response.status).toBe(200)
  expect(response.headers.get('content-type')).toStartWith('text/plain; version=0.0.4')
  exposition = await response.text()
}, 60_000)
afterAll(async () => {
  await server?.stop()
  await provider?.stop()
  await db?.drop()
})

const route = '/api/payments'

test('idempotency_requests_total counts every outcome, with 0 for those that did not happen', () => {
  const outcome = (name: string) => sample(exposition, 'idempotency_requests_total', { route, outcome: name })
  expect(outcome('created')).toBe(4)
  expect(outcome('replayed')).toBe(1)
  expect(outcome('mismatch')).toBe(1)
  expect(outcome('in_progress')).toBe(1)
  expect(outcome('invalid')).toBe(3) // the body outside the schema, the missing key, the 415 (a 401 never reaches the engine)
  expect(outcome('reclaimed')).toBe(0)
  expect(outcome('lease_lost')).toBe(0)
})

test('http_requests_total counts every answer, auth and validation refusals included', () => {
  const status = (code: string) => sample(exposition, 'http_requests_total', { method: 'POST', route, status: code })
  expect(status('201')).toBe(5) // 4 created + 1 replay
  expect(status('409')).toBe(1)
  expect(status('422')).toBe(1)
  expect(status('400')).toBe(2)
  expect(status('401')).toBe(1)
  expect(status('415')).toBe(1)
  expect(sample(exposition, 'http_request_duration_seconds_count', { method: 'POST', route, status: '201' })).toBe(5)
  expect(sample(exposition, 'http_request_duration_seconds_bucket', { method: 'POST', route, status: '201', le: '+Inf' })).toBe(5)
})

test('the database gauges see the stranded key and the request completed under two keys', () => {
  expect(sample(exposition, 'idempotency_stale_processing_keys', { tenant: 'globex' })).toBe(1)
  expect(sample(exposition, 'idempotency_stale_processing_keys', { tenant: 'acme' })).toBe(0)
  expect(sample(exposition, 'idempotency_oldest_processing_age_seconds')).toBeGreaterThanOrEqual(600)
  expect(sample(exposition, 'idempotency_duplicate_entities', { tenant: 'acme' })).toBe(1)
  expect(sample(exposition, 'idempotency_gauges_refresh_failed', { query: 'processing' })).toBe(0)
  expect(sample(exposition, 'idempotency_gauges_refresh_failed', { query: 'duplicates' })).toBe(0)
})

test('METRICS_DUPLICATE_WINDOW_SECONDS shortens the duplicates window: a repeat from before it is not counted', async () => {
  // The request completed under two keys above, both within seconds: counted by a service with the default hour,
  // and by one with a minute's window. Another one whose first completion is ten minutes old: counted by the first only.
  const earlier = fingerprintOf('completed ten minutes ago, and again now')
  const tenMinutesAgo = new Date(Date.now() - 10 * 60_000)
  await createKey(db.sql, identity({ tenant: 'globex', fingerprint: earlier }), { status: 'done', completedAt: tenMinutesAgo })
  await createKey(db.sql, identity({ tenant: 'globex', fingerprint: earlier }), { status: 'done', completedAt: new Date() })
  const short = await startServer(db.url, { METRICS_CACHE_MS: '0', METRICS_DUPLICATE_WINDOW_SECONDS: '60' }, { provider })
  try {
    const hour = await (await fetch(`${server.url}/metrics`)).text()
    const minute = await (await fetch(`${short.url}/metrics`)).text()
    expect([sample(hour, 'idempotency_duplicate_entities', { tenant: 'acme' }), sample(hour, 'idempotency_duplicate_entities', { tenant: 'globex' })]).toEqual([1, 1])
    expect([sample(minute, 'idempotency_duplicate_entities', { tenant: 'acme' }), sample(minute, 'idempotency_duplicate_entities', { tenant: 'globex' })]).toEqual([1, 0])
  } finally {
    await short.stop()
  }
}, 30_000)

test('METRICS_DUPLICATE_WINDOW_KEYS bounds what the duplicates query reads, and idempotency_duplicate_window_seconds says what it covered', async () => {
  // 1,000 requests completed once each, newer than every repeat above: a service reading 1,000 keys sees none of those.
  await db.sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, completed_at, response_status, response_body)
    select 'acme', 'bound-' || i, 'POST', '/api/payments', md5(i::text) || md5(i::text), 'done', now(), 201, '{}'
      from generate_series(1, 1000) i`
  const bounded = await startServer(db.url, { METRICS_CACHE_MS: '0', METRICS_DUPLICATE_WINDOW_KEYS: '1000' }, { provider })
  try {
    const hour = await (await fetch(`${server.url}/metrics`)).text()
    const newest = await (await fetch(`${bounded.url}/metrics`)).text()
    expect([sample(hour, 'idempotency_duplicate_entities', { tenant: 'acme' }), sample(hour, 'idempotency_duplicate_entities', { tenant: 'globex' })]).toEqual([1, 1])
    expect(sample(hour, 'idempotency_duplicate_window_seconds')).toBe(3600)
    expect([sample(newest, 'idempotency_duplicate_entities', { tenant: 'acme' }), sample(newest, 'idempotency_duplicate_entities', { tenant: 'globex' })]).toEqual([0, 0])
    // The 1,000 newest keys were created within the test's own seconds.
    expect(sample(newest, 'idempotency_duplicate_window_seconds')).toBeLessThan(600)
  } finally {
    await bounded.stop()
    await deleteKeys(db.sql, 'bound-')
  }
}, 30_000)

test('process metrics: those that hold under Bun are there, the broken ones are not', () => {
  for (const name of ['process_cpu_seconds_total', 'process_resident_memory_bytes', 'process_open_fds', 'process_start_time_seconds', 'nodejs_eventloop_lag_p99_seconds', 'nodejs_heap_size_used_bytes'])
    expect(sample(exposition, name)).toBeGreaterThan(0)
  expect(sample(exposition, 'bun_version_info', { version: Bun.version })).toBe(1)
  for (const name of UNSUPPORTED_UNDER_BUN) expect(exposition).not.toContain(`\n${name}`)
})

test('promtool check metrics finds nothing to lint in the exposition', async () => {
  const lint = Bun.spawn(['promtool', 'check', 'metrics'], { stdin: new TextEncoder().encode(exposition), stdout: 'pipe', stderr: 'pipe' })
  const [code, out, err] = await Promise.all([lint.exited, new Response(lint.stdout).text(), new Response(lint.stderr).text()])
  expect(`${out}${err}`.trim()).toBe('')
  expect(code).toBe(0)
})

test('hostile label values cannot appear: the route label comes from a fixed list', async () => {
  await fetch(`${server.url}/api/payments/%22%7D%20evil%7B`, { headers: { authorization: 'Bearer acme-key' } })
  await fetch(`${server.url}/whatever"} 1\nfake_metric 1`).catch(() => undefined)
  const text = await (await fetch(`${server.url}/metrics`)).text()
  expect(text).not.toContain('evil')
  expect(text).not.toContain('fake_metric')
  expect(sample(text, 'http_requests_total', { method: 'GET', route: '/api/payments/:id', status: '404' })).toBe(1)
})
