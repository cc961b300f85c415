/**
 * WORKERS=2: two Bun processes share the port (reusePort). The storm must hold
 * across processes (the database is the only lock), a worker that dies is
 * replaced, and stopping the supervisor drains every worker.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { payment } from '../support/http'
import { waitFor, waitForClaims } from '../support/wait'

let db: TestDatabase
/** Holds charges on demand: requests stay in flight exactly as long as a test needs (no provider delay to outlast). */
let provider: GatedProvider
let server: ServerProcess
beforeAll(async () => {
  db = await createTestDatabase('chaos_workers')
  provider = await startGatedProvider()
  server = await startServer(db.url, { WORKERS: '2' }, { provider })
  await waitFor(() => listeningPids(server.output()).length >= 2, 'both workers listening', 20_000)
})
afterAll(async () => {
  if (server?.proc.exitCode === null) await server.stop('SIGKILL')
  await provider?.stop()
  await db?.drop()
})

function listeningPids(output: string): number[] {
  return [...output.matchAll(/listening on \S+ \(pid (\d+)\)/g)].map((m) => Number(m[1]))
}

/** The in-flight counts of the workers' "draining" lines, in order. */
function drainingCounts(output: string): number[] {
  return [...output.matchAll(/: draining (\d+) in-flight request/g)].map((m) => Number(m[1]))
}

function alive(pid: number): boolean {
  try { process.kill(pid, 0); return true } catch { return false }
}

/** The pids of the processes that claimed these keys: a claim records its process (owner), whose heartbeat row has its pid. */
async function claimedBy(keys: string[]): Promise<number[]> {
  const rows = await db.sql<{ pid: number }[]>`
    select distinct p.pid from idempotency_key_states k join idempotency_processes p on p.id = k.owner
     where k.tenant = 'acme' and k.key in ${db.sql(keys)}`
  return rows.map((row) => row.pid).sort()
}

/**
 * A POST, retried (same key, so safely) on a connection error: after a worker
 * dies, the client's kept-alive connections to it are reset, as any client
 * of a multi-process server sees.
 */
async function post(key: string, body = payment(), url = () => server.url, options: { fresh?: boolean } = {}): Promise<Response> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fetch(`${url()}/api/payments`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: 'Bearer acme-key', 'idempotency-key': key },
        body: JSON.stringify(body),
        // A connection of its own: the kernel then picks a worker for each request.
        ...(options.fresh ? { keepalive: false } : {}),
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
  const workers = listeningPids(server.output()).sort()
  const [{ started }] = await db.sql<{ started: Date }[]>`select clock_timestamp() as started` as unknown as [{ started: Date }]
  // The first charge waits at the provider until all 299 retries are answered:
  // the whole storm lands while the first request is processing.
  provider.hold(1)
  let answered = 0
  // Both processes answer the storm: each runs claim statements for it. A
  // backend shows its running (or last) statement (its first kilobyte, which
  // names the claim), and its pool's application_name the worker's pid.
  // Sampled all through the storm: a backend's last statement may be a
  // heartbeat by the time the storm is over.
  const claimerPids = new Set<number>()
  let sampling = true
  const sampler = (async () => {
    while (sampling) {
      const rows = await db.sql<{ pid: number }[]>`
        select distinct split_part(application_name, ':', 2)::int as pid
          from pg_stat_activity
         where datname = current_database() and application_name like 'idempotent-post:%:short'
           and query_start >= ${started} and query like '/* idempotent-post: claim */%'`
      for (const row of rows) claimerPids.add(row.pid)
      await Bun.sleep(2)
    }
  })()
  const stormed = Promise.all(Array.from({ length: 300 }, () => post(key).then((r) => { answered++; return r })))
  try {
    await waitFor(() => answered === 299 && provider.held() === 1, () => `299 of 300 answered while the first is held (${answered} so far)`, 30_000)
  } finally {
    sampling = false
    await sampler
  }
  const claimers = [...claimerPids].map((pid) => ({ pid }))
  provider.release()
  const responses = await stormed
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
  const processes = claimers.length
  expect(processes).toBe(2)
  expect(claimers.map((row) => row.pid).sort()).toEqual(workers)
}, 30_000)

test('a worker that dies is replaced, and the port keeps answering meanwhile', async () => {
  const [victim, survivor] = listeningPids(server.output())
  process.kill(victim!, 'SIGKILL')
  // The survivor alone answers new connections while the victim is down.
  const statuses = await Promise.all(Array.from({ length: 20 }, async () => (await post(crypto.randomUUID())).status))
  expect(statuses).toEqual(statuses.map(() => 201))
  await waitFor(() => listeningPids(server.output()).length >= 3, 'a replacement worker', 20_000)
  expect(server.output()).toContain(`worker ${victim} exited on its own (SIGKILL); restarting it`)
  const replacement = listeningPids(server.output())[2]!
  expect(alive(replacement)).toBe(true)
  expect(alive(survivor!)).toBe(true)
}, 30_000)

test('SIGTERM to the supervisor drains every worker: in-flight requests answered, exit 0, nothing left processing', async () => {
  const workers = listeningPids(server.output()).filter(alive)
  expect(workers).toHaveLength(2)
  provider.hold()
  // 24 connections of their own: all on one worker by chance once in 2^23 runs.
  const keys = Array.from({ length: 24 }, () => crypto.randomUUID())
  const inFlight = keys.map((key) => post(key, payment(), undefined, { fresh: true }))
  await waitForClaims(db.sql, keys, 'acme', 20_000)
  await waitFor(() => provider.held() === keys.length, 'all requests held at the provider')
  // Both workers hold some of them: the drain below is every worker's.
  expect(await claimedBy(keys)).toEqual([...workers].sort())
  server.proc.kill('SIGTERM')
  await waitFor(() => drainingCounts(server.output()).length === 2, 'both workers to start draining')
  const draining = drainingCounts(server.output())
  expect(draining.every((n) => n > 0)).toBe(true)
  expect(draining.reduce((sum, n) => sum + n, 0)).toBe(keys.length)
  provider.release()
  const statuses = await Promise.all(inFlight.map(async (r) => (await r).status))
  expect(statuses).toEqual(keys.map(() => 201))
  expect(await server.proc.exited).toBe(0)
  for (const pid of workers) expect(alive(pid)).toBe(false)
  const { processing } = (await db.sql`select count(*)::int as processing from idempotency_key_states where status = 'processing'`)[0]!
  expect(processing).toBe(0)
  const { paid } = (await db.sql`select count(*)::int as paid from payments where idempotency_key in ${db.sql(keys)}`)[0]!
  expect(paid).toBe(keys.length)
  expect(server.output()).toContain('all workers stopped')
}, 30_000)

test('workers of a SIGKILLed supervisor drain and exit instead of serving on orphaned', async () => {
  const other = await startServer(db.url, { WORKERS: '2' })
  try {
    await waitFor(() => listeningPids(other.output()).length >= 2, 'both workers listening', 20_000)
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
  const service = await startDetached([process.execPath, 'src/main.ts'], { DATABASE_URL: db.url, WORKERS: '2', PAYMENT_PROVIDER_URL: provider.url })
  try {
    await waitFor(() => listeningPids(service.output()).length >= 2, 'both workers listening', 20_000)
    provider.hold()
    const keys = Array.from({ length: 10 }, () => crypto.randomUUID())
    const answers = keys.map((key) => post(key, payment(), () => service.url, { fresh: true }).then((r) => r.status, () => 0))
    // Every request is at the provider, so inside its worker's in-flight set (a committed
    // claim alone is not: the worker registers a request when its claim's answer arrives).
    await waitFor(() => provider.held() === keys.length, () => `all ${keys.length} charges held (${provider.held()})`, 20_000)
    process.kill(-service.proc.pid, 'SIGINT')
    await waitFor(() => drainingCounts(service.output()).length === 2, 'both workers to start draining')
    expect(drainingCounts(service.output()).reduce((sum, n) => sum + n, 0)).toBe(keys.length)
    provider.release()
    expect(await Promise.all(answers)).toEqual(keys.map(() => 201))
    expect(await service.exited()).toBe(0)
    expect(groupMembers(service.proc.pid)).toEqual([])
    const { processing } = (await db.sql<{ processing: number }[]>`select count(*)::int as processing from idempotency_key_states where status = 'processing'`)[0]!
    expect(processing).toBe(0)
  } finally {
    provider.release()
    if (service.proc.exitCode === null) process.kill(-service.proc.pid, 'SIGKILL')
  }
}, 30_000)

test('a worker that keeps dying: after 5 restarts within a minute the supervisor stops all and exits 1', async () => {
  const looping = await startServer(db.url, { WORKERS: '2' })
  try {
    const killed = new Set<number>()
    const nextVictim = () => listeningPids(looping.output()).filter(alive).find((pid) => !killed.has(pid))
    while (looping.proc.exitCode === null) {
      await waitFor(() => looping.proc.exitCode !== null || nextVictim() !== undefined, 'a new worker to kill, or the supervisor to give up', 20_000)
      const victim = nextVictim()
      if (victim === undefined || looping.proc.exitCode !== null) continue
      killed.add(victim)
      try { process.kill(victim, 'SIGKILL') } catch { /* it died on its own */ }
    }
    expect(await looping.proc.exited).toBe(1)
    expect(looping.output()).toContain('5 restarts within 60 s: stopping all')
    for (const pid of listeningPids(looping.output())) expect(alive(pid)).toBe(false)
  } finally {
    if (looping.proc.exitCode === null) looping.proc.kill('SIGKILL')
  }
}, 30_000)
