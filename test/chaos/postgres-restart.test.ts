/**
 * PostgreSQL stops under load and comes back. The suite's shared server must
 * not be restarted (other files use it), so this file runs a private embedded
 * PostgreSQL in a temp dir and points a real service process at it.
 *
 * While the database is down: /readyz says 503 within a second or two; a
 * POST waits for the database up to DATABASE_WAIT_MS (a failover's seconds,
 * src/server.ts), then gets a 503 problem+json with Retry-After, so nothing
 * hangs; one whose wait outlasts the outage is served. When it is back, the
 * same service process recovers by itself, and after the clients' retries
 * every key has exactly one payment.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { chmodSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { startEmbedded, type EmbeddedPostgres } from '../../src/store/embedded'
import { DATABASE_WAIT_MS } from '../../src/server'
import { migrateService } from '../../src/store/migrate'
import { startServer, type ServerProcess } from '../support/server'
import { payment, postPayment } from '../support/http'
import { waitUntil } from '../support/wait'
import { exactlyOnce, freePort, payUntilAnswered, paymentsByKey, tally, type Attempt } from './clients'

const KEYS = 40
/** Longer than DATABASE_WAIT_MS, so that the POSTs of its first seconds are refused while it lasts. */
const OUTAGE_MS = 6_000

let temp: string
let dataDir: string
let port: number
let pg: EmbeddedPostgres
let sql: postgres.Sql
let server: ServerProcess
beforeAll(async () => {
  temp = mkdtempSync(join(tmpdir(), 'idem-pg-restart-'))
  chmodSync(temp, 0o755) // as root, the server runs as `postgres`, which must reach the data dir
  dataDir = join(temp, 'pg')
  port = freePort()
  pg = await startEmbedded({ dir: dataDir, port })
  await migrateService(pg.url)
  sql = postgres(pg.url, { max: 2, onnotice: () => undefined })
  server = await startServer(pg.url, { IDEMPOTENCY_TTL_SECONDS: '1', PAYMENT_PROVIDER_DELAY_MS: '100' })
}, 60_000)
afterAll(async () => {
  if (server && server.proc.exitCode !== null && server.proc.exitCode !== 0) console.error(`the service exited ${server.proc.exitCode}:\n${server.output()}`)
  if (server?.proc.exitCode === null) await server.stop('SIGKILL')
  await sql?.end({ timeout: 1 })
  await pg?.stop()
  if (temp) rmSync(temp, { recursive: true, force: true })
})

async function timed<T>(run: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const started = performance.now()
  const value = await run()
  return { value, ms: performance.now() - started }
}

test('a database restart under load: 503s while down, recovery without a service restart, nothing duplicated or lost', async () => {
  const servicePid = server.proc.pid
  const results = new Map<string, Attempt[]>()
  const clients = Array.from({ length: KEYS }, async (_, i) => {
    await Bun.sleep(i * 100) // spread over 4 s: before, during and after the outage
    const key = `pg-${i}-${crypto.randomUUID()}`
    results.set(key, await payUntilAnswered(key, payment({ customer: `cus_${i}` }), { url: () => server.url, pauseMs: 300 }))
  })

  await Bun.sleep(800)
  const stoppedAt = performance.now()
  await pg.stop()

  // Readiness notices the outage.
  let notReadyAfterMs = Infinity
  if (await waitUntil(async () => (await fetch(`${server.url}/readyz`)).status === 503, 10_000, 50)) notReadyAfterMs = performance.now() - stoppedAt
  const readyzDown = await timed(() => fetch(`${server.url}/readyz`))

  // POSTs wait for the database up to DATABASE_WAIT_MS, then fail with a 503
  // problem and Retry-After: those of the outage's first seconds are answered
  // while it is still down; a later one may be served once it is back.
  const downKeys: string[] = []
  const downPosts: Promise<{ value: { status: number; contentType: string | null; retryAfter: string | null; body: { status: number } }; ms: number; sentAt: number; answeredAt: number }>[] = []
  while (performance.now() - stoppedAt < OUTAGE_MS) {
    for (let i = 0; i < 3; i++) {
      const key = `down-${crypto.randomUUID()}`
      downKeys.push(key)
      const sentAt = performance.now()
      downPosts.push(timed(async () => {
        const response = await postPayment(server.url, payment(), { key })
        return { status: response.status, contentType: response.headers.get('content-type'), retryAfter: response.headers.get('retry-after'), body: await response.json() as { status: number } }
      }).then((t) => ({ ...t, sentAt, answeredAt: performance.now() })))
    }
    await Bun.sleep(400)
  }

  const restartBegins = performance.now()
  pg = await startEmbedded({ dir: dataDir, port })
  const restartedAt = performance.now()
  const down = await Promise.all(downPosts)
  let readyAfterMs = Infinity
  if (await waitUntil(async () => (await fetch(`${server.url}/readyz`)).status === 200, 20_000, 50)) readyAfterMs = performance.now() - restartedAt
  // Once ready, reads answer at once, even through a pooled connection that died with the old server.
  const reads = await Promise.all(Array.from({ length: 8 }, () =>
    fetch(`${server.url}/api/payments?customer=cus_0`, { headers: { authorization: 'Bearer acme-key' } }).then((r) => r.status)))
  expect(reads).toEqual(Array(8).fill(200))

  // The refused requests' clients retry; the rest are still running theirs.
  const downResults = await Promise.all(downKeys.map((key) => payUntilAnswered(key, payment(), { url: () => server.url })))
  downKeys.forEach((key, i) => results.set(key, downResults[i]!))
  await Promise.all(clients)

  const counts = tally(results.values())
  console.log(`postgres restart: /readyz 503 after ${notReadyAfterMs.toFixed(0)} ms (a down /readyz took ${readyzDown.ms.toFixed(0)} ms); `
    + `${down.length} POSTs while down answered in ${Math.min(...down.map((p) => p.ms)).toFixed(0)}..${Math.max(...down.map((p) => p.ms)).toFixed(0)} ms; ready again ${readyAfterMs.toFixed(0)} ms after the database; answers: ${JSON.stringify(counts)}`)

  expect(readyzDown.value.status).toBe(503)
  expect(readyzDown.value.headers.get('content-type')).toBe('application/problem+json')
  // Bounds against hanging (postgres.js defaults hung ~20 s), not speed targets: figures are in the log line.
  expect(notReadyAfterMs).toBeLessThan(5_000)
  for (const post of down) {
    if (post.sentAt + DATABASE_WAIT_MS + 1_000 < restartBegins) {
      // Its wait ran out while the database was still down: refused then, not queued behind the outage.
      expect(post.answeredAt).toBeLessThan(restartBegins)
      expect(post.value.status).toBe(503)
    }
    if (post.value.status === 503) {
      expect(post.value.contentType).toBe('application/problem+json')
      expect(post.value.body.status).toBe(503)
      expect(Number(post.value.retryAfter)).toBeGreaterThanOrEqual(1)
      expect(post.ms).toBeLessThan(DATABASE_WAIT_MS + 2_000)
    } else {
      expect(post.value.status).toBe(201)
    }
  }
  expect(readyAfterMs).toBeLessThan(15_000)
  // The service itself never restarted.
  expect(server.proc.exitCode).toBeNull()
  expect(server.proc.pid).toBe(servicePid)
  // Only answers a client can act on: success, in progress, database away, and a deadline passed: with the 1 s TTL
  // (so that keys stranded by the outage are reclaimed within the test) a request claimed as the database came back
  // can run past it on a busy machine; its key is released and the client's retry pays once (checked below).
  expect(Object.keys(counts).filter((label) => !['201', '201 replay', '409', '503', '504'].includes(label))).toEqual([])
  const deadlines = [...results.values()].flat().filter((attempt) => attempt.status === 504)
  expect(deadlines.filter((attempt) => !attempt.error?.includes('deadline-exceeded'))).toEqual([])
  expect(counts['503'] ?? 0).toBeGreaterThan(0)

  const payments = await paymentsByKey(sql)
  expect(results.size).toBe(KEYS + downKeys.length)
  expect(exactlyOnce(results, payments)).toEqual([])
  const { processing } = (await sql`select count(*)::int as processing from idempotency_key_states where status = 'processing'`)[0]!
  expect(processing).toBe(0)
  expect(await server.stop()).toBe(0)
}, 90_000)
