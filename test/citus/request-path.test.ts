/**
 * The request path on a real Citus cluster (a coordinator and two workers,
 * test/support/citus.ts), tables distributed by tenant (sql/engine/00011): every
 * statement of a request reaches its tenant's worker alone, with no two-phase
 * commit, as Citus itself reports what it sends (`citus.log_remote_commands`:
 * one NOTICE per command, naming the node). Then the two traps the first trial
 * fell into (issue 47): completed keys left on the processing list, and
 * abandoned keys that no retry could take over.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { completeRows } from '../../src/core/complete-rows'
import { release } from '../../src/core/release'
import type { ClaimResult, Lease, StoredResponse } from '../../src/core/types'
import { createMetrics, observePools } from '../../src/metrics/registry'
import { openPools } from '../../src/store/db'
import { migrateService } from '../../src/store/migrate'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../support/citus'
import { track, waitFor, within } from '../support/wait'

const TTL = 30
const RETENTION = 3600
const timing = { ttlSeconds: TTL, retentionSeconds: RETENTION }
const OK: StoredResponse = { status: 201, headers: { 'content-type': 'application/json' }, body: '{"ok":true}' }
const FINGERPRINT = 'a'.repeat(64)

let cluster: CitusCluster
let db: CitusDatabase
/** Assertions and setup, untraced. */
let sql: postgres.Sql
/** The pool the engine runs on, every remote command Citus sends for it recorded in `sent`. */
let traced: postgres.Sql
const sent: { port: number; text: string }[] = []
/** Two tenants whose shards are on different workers: [on workers[0], on workers[1]]. */
let tenants: [string, string]

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('request_path', { shardCount: 4 })
  await migrateService(db.url)
  sql = postgres(db.url, { max: 4, onnotice: () => undefined })
  traced = postgres(db.url, {
    max: 6, fetch_types: false,
    connection: { 'citus.log_remote_commands': 'on', client_min_messages: 'log' } as Record<string, string>,
    onnotice: (notice) => {
      const port = /on server \S+:(\d+)/.exec(notice.detail ?? '')?.[1]
      const message = String(notice.message ?? '')
      if (message.startsWith('issuing ') && port) sent.push({ port: Number(port), text: message.slice('issuing '.length) })
    },
  })
  const found = new Map<number, string>()
  for (let i = 0; found.size < 2 && i < 200; i++) {
    const tenant = `tenant-${i}`
    const port = await workerOf(tenant)
    if (!found.has(port)) found.set(port, tenant)
  }
  tenants = [found.get(cluster.workers[0]!.port)!, found.get(cluster.workers[1]!.port)!]
}, 180_000)

afterAll(async () => {
  await traced?.end({ timeout: 1 })
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

/** The port of the worker that holds the tenant's shard of the key table. */
async function workerOf(tenant: string): Promise<number> {
  const [row] = await sql<{ port: number }[]>`
    select p.nodeport as port from pg_dist_placement pl join pg_dist_node p using (groupid)
     where pl.shardid = get_shard_id_for_distribution_column('idempotency_keys', ${tenant}::text)`
  return row!.port
}

/** `count` tenants whose shards are on the worker of `port`. */
async function tenantsOn(port: number, count: number, prefix: string): Promise<string[]> {
  const found: string[] = []
  for (let i = 0; found.length < count && i < 2_000; i++) if (await workerOf(`${prefix}-${i}`) === port) found.push(`${prefix}-${i}`)
  return found
}

/** SIGSTOP (or SIGCONT) every process of a node: a worker frozen, its connections open and silent. */
function signalNode(name: string, signal: 'SIGSTOP' | 'SIGCONT'): void {
  const postmaster = Number(readFileSync(join(cluster.home, name, 'postmaster.pid'), 'utf8').split('\n')[0])
  const children = Bun.spawnSync(['pgrep', '-P', String(postmaster)]).stdout.toString().split('\n').filter(Boolean).map(Number)
  for (const pid of [postmaster, ...children]) process.kill(pid, signal)
}

/** The remote commands Citus sent while `work` ran. */
async function commandsOf<T>(work: () => Promise<T>): Promise<{ result: T; commands: { port: number; text: string }[] }> {
  sent.length = 0
  const result = await work()
  return { result, commands: sent.splice(0) }
}

function expectOneWorker(commands: readonly { port: number; text: string }[], port: number): void {
  expect(commands.length).toBeGreaterThan(0)
  expect([...new Set(commands.map((c) => c.port))]).toEqual([port])
  expect(commands.filter((c) => /PREPARE TRANSACTION|COMMIT PREPARED/i.test(c.text))).toEqual([])
}

const identity = (tenant: string, key: string) => ({ tenant, key, method: 'POST', path: '/api/payments', fingerprint: FINGERPRINT })
const leaseOf = (result: ClaimResult): Lease => {
  if (result.kind !== 'created' && result.kind !== 'reclaimed') throw new Error(`expected a claim, got ${result.kind}`)
  return result.lease
}
const paymentRow = (tenant: string, key: string) => ({
  id: crypto.randomUUID(), tenant, amount: 500, currency: 'EUR', customer: 'c-1', description: null, status: 'succeeded',
  provider_ref: `ref-${key}`, idempotency_key: key, created_at: new Date().toISOString(),
})

/** The key's status, its entries in the processing list and its payments (the tenant a constant everywhere, so the query needs its worker only). */
async function keyState(tenant: string, key: string) {
  const [row] = await sql<{ status: string; listed: number; payments: number }[]>`
    select k.status,
           (select count(*)::int from idempotency_processing pr where pr.tenant = ${tenant} and pr.key = ${key}) as listed,
           (select count(*)::int from payments p where p.tenant = ${tenant} and p.idempotency_key = ${key}) as payments
      from idempotency_key_states k where k.tenant = ${tenant} and k.key = ${key}`
  return row
}

describe('every request-path statement reaches one worker, with no two-phase commit', () => {
  test('a fresh claim and its declarative completion (the lane) are one command each, on the tenant\'s worker', async () => {
    for (const tenant of tenants) {
      const port = await workerOf(tenant)
      const claimed = await commandsOf(() => claim(traced, identity(tenant, 'fresh-1'), timing))
      expect(claimed.result.kind).toBe('created')
      expectOneWorker(claimed.commands, port)
      expect(claimed.commands).toHaveLength(1)

      const lease = leaseOf(claimed.result)
      const completed = await commandsOf(() => completeRows(traced, lease, OK, { payments: [paymentRow(tenant, 'fresh-1')] }))
      expectOneWorker(completed.commands, port)
      expect(completed.commands).toHaveLength(1)
      expect(await keyState(tenant, 'fresh-1')).toEqual({ status: 'done', listed: 0, payments: 1 })

      const replayed = await commandsOf(() => claim(traced, identity(tenant, 'fresh-1'), timing))
      expect(replayed.result.kind).toBe('replay')
      expectOneWorker(replayed.commands, port)
    }
  })

  test('sixteen claims of one tenant at once share calls, all on its worker', async () => {
    const [tenant] = tenants
    const port = await workerOf(tenant)
    const keys = Array.from({ length: 16 }, (_, i) => `batch-${i}`)
    const { result, commands } = await commandsOf(() => Promise.all(keys.map((key) => claim(traced, identity(tenant, key), timing))))
    expect(result.map((r) => r.kind)).toEqual(keys.map(() => 'created'))
    expectOneWorker(commands, port)
    expect(commands.length).toBeLessThan(keys.length)
  })

  test('the transactional completion, a release, a retake, a reclaim and a renewal each stay on the tenant\'s worker', async () => {
    const [, tenant] = tenants
    const port = await workerOf(tenant)

    const first = leaseOf(await claim(traced, identity(tenant, 'tx-1'), timing))
    const transactional = await commandsOf(() => complete(traced, first, async (tx) => {
      await tx`insert into payments ${tx(paymentRow(tenant, 'tx-1'))}`
      return OK
    }))
    expectOneWorker(transactional.commands, port)
    expect(await keyState(tenant, 'tx-1')).toEqual({ status: 'done', listed: 0, payments: 1 })

    const second = leaseOf(await claim(traced, identity(tenant, 'rel-1'), timing))
    const released = await commandsOf(() => release(traced, second))
    expect(released.result).toBe(true)
    expectOneWorker(released.commands, port)
    expect(released.commands).toHaveLength(1)
    expect(await keyState(tenant, 'rel-1')).toMatchObject({ status: 'released', listed: 0 })

    const retaken = await commandsOf(() => claim(traced, identity(tenant, 'rel-1'), timing))
    expect(retaken.result.kind).toBe('created')
    expectOneWorker(retaken.commands, port)
    expect(await keyState(tenant, 'rel-1')).toMatchObject({ status: 'processing', listed: 1 })

    // An owner with no heartbeat row is gone: its key is abandoned, and the next claim takes it over.
    await claim(traced, identity(tenant, 'gone-1'), { ...timing, owner: crypto.randomUUID() })
    const reclaimed = await commandsOf(() => claim(traced, identity(tenant, 'gone-1'), timing))
    expect(reclaimed.result.kind).toBe('reclaimed')
    expectOneWorker(reclaimed.commands, port)
    expect(await keyState(tenant, 'gone-1')).toMatchObject({ status: 'processing', listed: 1 })

    const later = new Date(Date.now() + (RETENTION + 60) * 1000)
    const renewed = await commandsOf(() => claim(traced, identity(tenant, 'tx-1'), { ...timing, now: later }))
    expect(renewed.result.kind).toBe('created')
    expectOneWorker(renewed.commands, port)
    expect(await keyState(tenant, 'tx-1')).toMatchObject({ status: 'processing', listed: 1 })
  })
})

describe('the traps of the first trial (issue 47)', () => {
  test('completed keys leave the processing list: no step reads a snapshot taken before the completion\'s own update', async () => {
    // Under Citus the writable CTEs of one statement do not share a snapshot: the completion's `before`
    // was read after its UPDATE, and every completed key stayed listed, with no error.
    const keys = Array.from({ length: 12 }, (_, i) => `listed-${i}`)
    const leases = await Promise.all(tenants.flatMap((tenant) => keys.map((key) => claim(traced, identity(tenant, key), timing).then(leaseOf))))
    await Promise.all(leases.map((lease) => completeRows(traced, lease, OK, { payments: [paymentRow(lease.tenant, lease.key)] })))
    for (const tenant of tenants) {
      const [row] = await sql<{ done: number; listed: number; payments: number }[]>`
        select count(*) filter (where k.status = 'done')::int as done,
               (select count(*)::int from idempotency_processing pr where pr.tenant = ${tenant} and pr.key like 'listed-%') as listed,
               (select count(*)::int from payments p where p.tenant = ${tenant} and p.idempotency_key like 'listed-%') as payments
          from idempotency_key_states k where k.tenant = ${tenant} and k.key like 'listed-%'`
      expect(row).toEqual({ done: keys.length, listed: 0, payments: keys.length })
    }
  })

  test('after a crash every abandoned key is taken over once, listed under its new deadline, and completes', async () => {
    // The process that claimed them beat, then died (its heartbeat row is gone): 16 keys in processing.
    const dead = crypto.randomUUID()
    await sql`insert into idempotency_processes (id, pid, hostname, leases) values (${dead}, 1, 'crashed', '{}')`
    const keys = Array.from({ length: 16 }, (_, i) => `crash-${i}`)
    const [tenant] = tenants
    const first = await Promise.all(keys.map((key) => claim(traced, identity(tenant, key), { ...timing, owner: dead }).then(leaseOf)))
    await sql`delete from idempotency_processes where id = ${dead}`

    const retries = await Promise.all(keys.map((key) => claim(traced, identity(tenant, key), timing)))
    expect(retries.map((r) => r.kind)).toEqual(keys.map(() => 'reclaimed'))
    const taken = retries.map(leaseOf)
    taken.forEach((lease, i) => {
      expect(lease.lease).not.toBe(first[i]!.lease)
      expect(lease.requestId).toBe(first[i]!.requestId) // the same downstream key: a charge made before the crash is found, not repeated
    })
    const [listed] = await sql<{ entries: number; keys: number }[]>`
      select count(*)::int as entries, count(distinct pr.key)::int as keys from idempotency_processing pr
        -- Under the key's deadline in the old form (the row's stale_at), under its lease in the new (sql/engine/00020).
        join idempotency_keys k on k.tenant = pr.tenant and k.key = pr.key
         and (k.stale_at = pr.stale_at or (k.digest is not null and pr.lease = k.lease))
       where pr.tenant = ${tenant} and pr.key like 'crash-%'`
    expect(listed).toEqual({ entries: keys.length, keys: keys.length })

    await Promise.all(taken.map((lease) => completeRows(traced, lease, OK, { payments: [paymentRow(tenant, lease.key)] })))
    for (const key of keys) expect(await keyState(tenant, key)).toEqual({ status: 'done', listed: 0, payments: 1 })
  })
})

describe('the statements run on the tenant\'s shard', () => {
  test('a worker that does not hold the tenant\'s shard refuses to run its statement (a shard moved under a call), writing nothing', async () => {
    const [tenant] = tenants
    const other = cluster.workers.find((worker) => worker.port !== cluster.workers[0]!.port)!
    const direct = postgres(other.urlOf(db.name), { max: 1, onnotice: () => undefined })
    try {
      const refused = await direct`select idempotency_local_shard('idempotency_keys', ${tenant}::text)`.then(() => undefined, (error: unknown) => error)
      expect((refused as { code?: string } | undefined)?.code).toBe('40001') // a serialization failure: the lane sends it again, alone
      const [here] = await direct<{ shard: string }[]>`select idempotency_local_shard('idempotency_keys', ${tenants[1]}::text) as shard`
      expect(here!.shard).toMatch(/^idempotency_keys_\d+$/)
    } finally {
      await direct.end()
    }
  })

  test('a worker that stops fails only the calls of its own tenants', async () => {
    const [down, up] = tenants
    const worker = cluster.workers[0]!
    expect(await workerOf(down)).toBe(worker.port)
    await worker.stop()
    try {
      const stuck = track(claim(traced, identity(down, 'stall-1'), timing))
      stuck.promise.catch(() => undefined)
      // The other worker's tenant claims and completes while the first call is held or failing.
      const lease = leaseOf(await claim(traced, identity(up, 'stall-1'), timing))
      await completeRows(traced, lease, OK, { payments: [paymentRow(up, 'stall-1')] })
      expect(await keyState(up, 'stall-1')).toEqual({ status: 'done', listed: 0, payments: 1 })
      await waitFor(() => stuck.settled(), 'the claim on the stopped worker to fail', 60_000)
      await expect(stuck.promise).rejects.toThrow()
    } finally {
      await worker.start()
    }
    expect((await claim(traced, identity(down, 'stall-2'), timing)).kind).toBe('created')
  }, 120_000)

  test('a worker that freezes holds only its own pool: the other worker\'s tenants still claim and complete', async () => {
    const frozen = cluster.workers[0]!
    const many = await tenantsOn(frozen.port, 8, 'frozen')
    const [, healthy] = tenants
    // The service's pools (8 connections for single statements, the default): the lane's calls go through a pool per worker.
    const pools = openPools(db.url, { shortMax: 8, workMax: 1, applicationName: 'request-path-freeze' })
    const pool = pools.short
    try {
      // Before the freeze: the pool knows its form, each tenant's worker, and has its workers' pools open.
      await Promise.all([healthy, ...many].map((tenant) => claim(pool, identity(tenant, 'warm'), timing)))
      expect(pools.workers!.workers.sort()).toEqual(cluster.workers.map((w) => `127.0.0.1:${w.port}`).sort())
      // Each worker's pool in the metrics, as `worker host:port`.
      const metrics = createMetrics()
      observePools(metrics, pools.usage!, pools.workerUsage)
      const inUse = async (port: number) => Number(new RegExp(`idempotency_db_pool_connections_in_use\\{pool="worker 127\\.0\\.0\\.1:${port}"\\} (\\d+)`)
        .exec(await metrics.registry.metrics())?.[1])
      expect(await metrics.registry.metrics()).toContain(`idempotency_db_pool_connections_max{pool="worker 127.0.0.1:${frozen.port}"} 8`)
      signalNode(frozen.name, 'SIGSTOP')
      let stuck: ReturnType<typeof track<ClaimResult>>[] = []
      try {
        // Three claims per tenant on the frozen worker: more calls than a pool has connections, each hanging on its own.
        stuck = many.flatMap((tenant) => [1, 2, 3].map((n) => track(claim(pool, identity(tenant, `frozen-${n}`), timing))))
        for (const call of stuck) call.promise.catch(() => undefined)
        // Bounded, so a pool held by the frozen worker fails here, not by the test's timeout (the worker still frozen).
        const beside = await within((async () => {
          const lease = leaseOf(await claim(pool, identity(healthy, 'beside-frozen'), timing))
          await completeRows(pool, lease, OK, { payments: [paymentRow(healthy, 'beside-frozen')] })
          return 'completed'
        })(), 10_000, 'held behind the frozen worker')
        expect(beside).toBe('completed')
        // Answered while every call to the frozen worker still waits (their statement timeout is 5 s): not after them.
        expect(stuck.filter((call) => call.settled())).toHaveLength(0)
        // Those calls held their own pool whole meanwhile.
        await waitFor(async () => await inUse(frozen.port) === 8, 'every connection of the frozen worker\'s pool held by its calls', 3_000)
      } finally {
        signalNode(frozen.name, 'SIGCONT')
      }
      await Promise.allSettled(stuck.map((call) => call.promise))
    } finally {
      await pools.close(1)
    }
    expect(await keyState(healthy, 'beside-frozen')).toEqual({ status: 'done', listed: 0, payments: 1 })
  }, 120_000)
})
