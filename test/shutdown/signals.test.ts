/**
 * Graceful shutdown, over real HTTP with requests in flight (the provider
 * takes 500 ms): SIGTERM to the main process alone (a container runtime),
 * SIGINT and SIGTERM to the whole process group (Ctrl-C, a process manager),
 * and SIGTERM to npm under `npm start`. Each time: the in-flight requests are
 * answered, the listener closes, the pools close, the exit code is 0, and
 * no key is left in `processing`.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { waitFor } from '../support/wait'
import { alive, groupMembers, startDetached, type GroupProcess } from './spawn'

let db: TestDatabase
const started: GroupProcess[] = []
let ledgerDir: string
/** The provider takes 500 ms, so requests are in flight when the signal comes; its ledger is this file's own. */
let ENV: Record<string, string>
beforeAll(async () => {
  db = await createTestDatabase('shutdown')
  ledgerDir = mkdtempSync(join(tmpdir(), 'idem-shutdown-ledger-'))
  ENV = { PAYMENT_PROVIDER_DELAY_MS: '500', PAYMENT_PROVIDER_LEDGER: join(ledgerDir, 'ledger.sqlite') }
})
afterAll(async () => {
  for (const s of started) if (s.proc.exitCode === null) try { process.kill(-s.proc.pid, 'SIGKILL') } catch { /* gone */ }
  await db?.drop()
  if (ledgerDir) rmSync(ledgerDir, { recursive: true, force: true })
})

async function processingKeys(keys: string[]): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where key in ${db.sql(keys)} and status = 'processing'`
  return row!.n
}

/** Starts 8 payments and waits until all of them are inside their transactions. */
async function inFlight(service: GroupProcess) {
  const keys = Array.from({ length: 8 }, () => crypto.randomUUID())
  // A connection error is retried with the same key (safe): bun test's fetch may
  // hold a stale kept-alive connection to a port an earlier file's server used.
  // After the signal, a retry meets the closed listener, so a dropped request still fails.
  const post = async (key: string, attempt = 1): Promise<{ status: number; body: string }> => {
    try {
      const response = await postPayment(service.url, payment(), { key })
      return { status: response.status, body: await response.text() }
    } catch (error) {
      return attempt < 3 ? post(key, attempt + 1) : { status: 0, body: String(error) }
    }
  }
  const answers = keys.map((key) => post(key))
  await waitFor(async () => (await processingKeys(keys)) === keys.length, `all ${keys.length} keys in processing`)
  return { keys, answers }
}

async function expectDrained(service: GroupProcess, flight: Awaited<ReturnType<typeof inFlight>>, signalled: number) {
  // The listener stays through the drain (its /metrics and /readyz: test/shutdown/drain-metrics.test.ts) and closes with it.
  const answers = await Promise.all(flight.answers)
  const code = await service.exited()
  const drainMs = performance.now() - signalled
  expect(await fetch(`${service.url}/healthz`).then(() => 'answered', () => 'refused')).toBe('refused')
  expect(answers.map((a) => a.status)).toEqual(flight.keys.map(() => 201))
  expect(code).toBe(0)
  expect(service.output()).toContain('pools closed')
  expect(await processingKeys(flight.keys)).toBe(0)
  const [paidRow] = await db.sql<{ n: number }[]>`select count(*)::int as n from payments where idempotency_key in ${db.sql(flight.keys)}`
  expect(paidRow?.n).toBe(flight.keys.length)
  // No connection of the stopped process is left open.
  const pid = /listening on \S+ \(pid (\d+)\)/.exec(service.output())![1]
  const [openRow] = await db.sql<{ open: number }[]>`select count(*)::int as open from pg_stat_activity where application_name like ${`idempotent-post:${pid}:%`}`
  expect(openRow?.open).toBe(0)
  return drainMs
}

test('SIGTERM to the main process alone drains in-flight requests and exits 0', async () => {
  const service = await startDetached([process.execPath, 'src/main.ts'], { DATABASE_URL: db.url, ...ENV })
  started.push(service)
  const flight = await inFlight(service)
  const signalled = performance.now()
  process.kill(service.proc.pid, 'SIGTERM')
  const ms = await expectDrained(service, flight, signalled)
  console.log(`SIGTERM (process): drained 8 in-flight requests and exited 0 in ${ms.toFixed(0)} ms`)
}, 30_000)

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  test(`${signal} to the whole process group drains in-flight requests and exits 0`, async () => {
    const service = await startDetached([process.execPath, 'src/main.ts'], { DATABASE_URL: db.url, ...ENV })
    started.push(service)
    const flight = await inFlight(service)
    const signalled = performance.now()
    process.kill(-service.proc.pid, signal)
    const ms = await expectDrained(service, flight, signalled)
    expect(groupMembers(service.proc.pid)).toEqual([])
    console.log(`${signal} (group): drained 8 in-flight requests and exited 0 in ${ms.toFixed(0)} ms`)
  }, 30_000)
}

test('`npm start`: SIGTERM to npm (the main process) reaches the server, which drains; npm exits 0', async () => {
  const service = await startDetached(['npm', 'start', '--silent'], { DATABASE_URL: db.url, ...ENV, MIMALLOC_PURGE_DELAY: undefined })
  started.push(service)
  const flight = await inFlight(service)
  const serverPid = Number(/listening on \S+ \(pid (\d+)\)/.exec(service.output())![1])
  expect(serverPid).not.toBe(service.proc.pid) // npm is the main process, the server its child
  // The allocator setting of the start script reaches the server (docs/how-to/production.md).
  expect(readFileSync(`/proc/${serverPid}/environ`, 'utf8').split('\0')).toContain('MIMALLOC_PURGE_DELAY=-1')
  const signalled = performance.now()
  process.kill(service.proc.pid, 'SIGTERM')
  const ms = await expectDrained(service, flight, signalled)
  expect(alive(serverPid)).toBe(false)
  expect(service.output()).toContain('SIGTERM: draining')
  console.log(`npm start + SIGTERM to npm: drained and exited 0 in ${ms.toFixed(0)} ms`)
}, 30_000)

test('a drain that outlasts its deadline rolls back and releases the keys still in flight', async () => {
  // The provider takes 20 s, twice the drain deadline (DRAIN_TIMEOUT_MS in src/lifecycle.ts, 10 s).
  const service = await startDetached([process.execPath, 'src/main.ts'], { DATABASE_URL: db.url, ...ENV, PAYMENT_PROVIDER_DELAY_MS: '20000' })
  started.push(service)
  const flight = await inFlight(service)
  process.kill(service.proc.pid, 'SIGTERM')
  const answers = await Promise.all(flight.answers)
  expect(await service.exited()).toBe(0)
  expect(service.output()).toContain('drain deadline passed')
  // Their clients got an answer (503: retry) when the work pool closed under them, not a dropped connection.
  for (const answer of answers) expect(answer.status).toBe(503)
  // Nothing stuck, nothing paid: every key released, so the retry runs afresh.
  const states = await db.sql<{ status: string }[]>`select status from idempotency_key_states where key in ${db.sql(flight.keys)}`
  expect(states.map((row) => row.status)).toEqual(flight.keys.map(() => 'released'))
  const [paymentRow] = await db.sql<{ paid: number }[]>`select count(*)::int as paid from payments where idempotency_key in ${db.sql(flight.keys)}`
  expect(paymentRow?.paid).toBe(0)
}, 30_000)
