/**
 * WORKERS=2: two Bun processes share the port (reusePort). The storm must hold
 * across processes (the database is the only lock), a worker that dies is
 * replaced, and stopping the supervisor drains every worker.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer, type ServerProcess } from '../support/server'
import { payment } from '../support/http'

let db: TestDatabase
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('chaos_workers')
  // 500 ms of provider latency keeps the first request in flight while the storm lands.
  server = await startServer(db.url, { WORKERS: '2', PAYMENT_PROVIDER_DELAY_MS: '500' })
  await waitFor(() => listeningPids(server.output()).length >= 2, 'both workers listening')
})
afterAll(async () => {
  if (server?.proc.exitCode === null) await server.stop('SIGKILL')
  await db?.drop()
})

function listeningPids(output: string): number[] {
  return [...output.matchAll(/listening on \S+ \(pid (\d+)\)/g)].map((m) => Number(m[1]))
}

function alive(pid: number): boolean {
  try { process.kill(pid, 0); return true } catch { return false }
}

async function waitFor(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await condition()) return
    await Bun.sleep(25)
  }
  throw new Error(`timed out waiting for ${what}:\n${server.output()}`)
}

/**
 * A POST, retried (same key, so safely) on a connection error: after a worker
 * dies, the client's kept-alive connections to it are reset, as any client
 * of a multi-process server sees.
 */
async function post(key: string, body = payment(), url = () => server.url): Promise<Response> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fetch(`${url()}/api/payments`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: 'Bearer acme-key', 'idempotency-key': key },
        body: JSON.stringify(body),
      })
    } catch (error) {
      if (attempt === 5) throw error
    }
  }
}

test('the workers share one port', () => {
  const ports = new Set([...server.output().matchAll(/listening on [^\s]+:(\d+) /g)].map((m) => m[1]))
  expect(ports.size).toBe(1)
  expect(listeningPids(server.output())).toHaveLength(2)
})

test('300 concurrent requests with one key across 2 workers: one payment, the rest 409', async () => {
  const key = `storm-${crypto.randomUUID()}`
  const responses = await Promise.all(Array.from({ length: 300 }, () => post(key)))
  const answers = await Promise.all(responses.map(async (r) => ({
    status: r.status,
    replayed: r.headers.get('idempotent-replayed') === 'true',
    contentType: r.headers.get('content-type'),
    body: JSON.parse(await r.text()) as { id?: string; status?: number },
  })))
  const statuses = new Set(answers.map((a) => a.status))
  expect([...statuses].filter((s) => s !== 201 && s !== 409)).toEqual([])
  const fresh = answers.filter((a) => a.status === 201 && !a.replayed)
  expect(fresh).toHaveLength(1)
  const ids = new Set(answers.filter((a) => a.status === 201).map((a) => a.body.id))
  expect(ids.size).toBe(1)
  for (const conflict of answers.filter((a) => a.status === 409)) {
    expect(conflict.contentType).toBe('application/problem+json')
    expect(conflict.body.status).toBe(409)
  }
  const payments = await db.sql`select id::text from payments where idempotency_key = ${key}`
  expect(payments.map((p) => p.id)).toEqual([...ids])
  // Both processes answered: each has its own pool, named after its pid.
  const { processes } = (await db.sql`
    select count(distinct split_part(application_name, ':', 2))::int as processes
      from pg_stat_activity where datname = current_database() and application_name like 'idempotent-post:%'`)[0]!
  expect(processes).toBe(2)
}, 30_000)

test('a worker that dies is replaced, and the port keeps answering meanwhile', async () => {
  const [victim, survivor] = listeningPids(server.output())
  process.kill(victim!, 'SIGKILL')
  // The survivor alone answers new connections while the victim is down.
  const statuses = await Promise.all(Array.from({ length: 20 }, async () => (await post(crypto.randomUUID())).status))
  expect(statuses).toEqual(statuses.map(() => 201))
  await waitFor(() => listeningPids(server.output()).length >= 3, 'a replacement worker')
  expect(server.output()).toContain(`worker ${victim} exited on its own (SIGKILL); restarting it`)
  const replacement = listeningPids(server.output())[2]!
  expect(alive(replacement)).toBe(true)
  expect(alive(survivor!)).toBe(true)
}, 30_000)

test('SIGTERM to the supervisor drains every worker: in-flight requests answered, exit 0, nothing left processing', async () => {
  const workers = listeningPids(server.output()).filter(alive)
  expect(workers).toHaveLength(2)
  const keys = Array.from({ length: 12 }, () => crypto.randomUUID())
  const inFlight = keys.map((key) => post(key))
  await waitFor(async () => {
    const { n } = (await db.sql`select count(*)::int as n from idempotency_keys where key in ${db.sql(keys)} and status = 'processing'`)[0]!
    return n === keys.length
  }, 'all requests in flight')
  server.proc.kill('SIGTERM')
  const statuses = await Promise.all(inFlight.map(async (r) => (await r).status))
  expect(statuses).toEqual(keys.map(() => 201))
  expect(await server.proc.exited).toBe(0)
  for (const pid of workers) expect(alive(pid)).toBe(false)
  const { processing } = (await db.sql`select count(*)::int as processing from idempotency_keys where status = 'processing'`)[0]!
  expect(processing).toBe(0)
  const { paid } = (await db.sql`select count(*)::int as paid from payments where idempotency_key in ${db.sql(keys)}`)[0]!
  expect(paid).toBe(keys.length)
  expect(server.output()).toContain('all workers stopped')
}, 30_000)

test('workers of a SIGKILLed supervisor drain and exit instead of serving on orphaned', async () => {
  const other = await startServer(db.url, { WORKERS: '2' })
  try {
    await waitFor(() => listeningPids(other.output()).length >= 2, 'both workers listening')
    const workers = listeningPids(other.output())
    other.proc.kill('SIGKILL')
    await other.proc.exited
    await waitFor(() => workers.every((pid) => !alive(pid)), 'the orphaned workers to exit', 10_000)
  } finally {
    if (other.proc.exitCode === null) other.proc.kill('SIGKILL')
  }
}, 30_000)

test('SIGINT to the whole process group (supervisor and workers at once) drains every worker, exit 0', async () => {
  const { startDetached, groupMembers } = await import('../shutdown/spawn')
  const service = await startDetached([process.execPath, 'src/main.ts'], { DATABASE_URL: db.url, WORKERS: '2', PAYMENT_PROVIDER_DELAY_MS: '500' })
  try {
    const deadline = Date.now() + 20_000
    while (listeningPids(service.output()).length < 2 && Date.now() < deadline) await Bun.sleep(25)
    const keys = Array.from({ length: 10 }, () => crypto.randomUUID())
    const answers = keys.map((key) => post(key, payment(), () => service.url).then((r) => r.status, () => 0))
    while (Date.now() < deadline) {
      const { n } = (await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_keys where key in ${db.sql(keys)} and status = 'processing'`)[0]!
      if (n === keys.length) break
      await Bun.sleep(10)
    }
    process.kill(-service.proc.pid, 'SIGINT')
    expect(await Promise.all(answers)).toEqual(keys.map(() => 201))
    expect(await service.exited()).toBe(0)
    expect(groupMembers(service.proc.pid)).toEqual([])
    const { processing } = (await db.sql<{ processing: number }[]>`select count(*)::int as processing from idempotency_keys where status = 'processing'`)[0]!
    expect(processing).toBe(0)
  } finally {
    if (service.proc.exitCode === null) process.kill(-service.proc.pid, 'SIGKILL')
  }
}, 30_000)

test('a worker that keeps dying: after 5 restarts within a minute the supervisor stops all and exits 1', async () => {
  const looping = await startServer(db.url, { WORKERS: '2' })
  try {
    const killed = new Set<number>()
    const deadline = Date.now() + 25_000
    while (looping.proc.exitCode === null && Date.now() < deadline) {
      const victim = listeningPids(looping.output()).filter(alive).find((pid) => !killed.has(pid))
      if (victim !== undefined) { killed.add(victim); process.kill(victim, 'SIGKILL') }
      await Bun.sleep(50)
    }
    expect(await looping.proc.exited).toBe(1)
    expect(looping.output()).toContain('5 restarts within 60 s: stopping all')
    for (const pid of listeningPids(looping.output())) expect(alive(pid)).toBe(false)
  } finally {
    if (looping.proc.exitCode === null) looping.proc.kill('SIGKILL')
  }
}, 30_000)
