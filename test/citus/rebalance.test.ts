/**
 * An online rebalance onto a third worker under load (issue 47): the first
 * trial moved shards with 0 duplicates and 0 stuck keys, but answered 137 ×
 * 503 in block_writes mode and 7 × 500 in logical mode (Citus losing an
 * intermediate result of a CTE statement). Here: eight tenants, each on a
 * shard of its own (every shard carries load), pay fresh keys all along
 * while a third worker is added and `citus_rebalance_start` moves shards
 * onto it in logical mode (wal_level = logical, test/support/citus.ts).
 * 0 5xx, one payment and one charge per key at the provider, nothing stuck;
 * the tenants whose shards moved paid during the move and after it.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { isCitus } from '../../src/store/citus'
import { migrateService } from '../../src/store/migrate'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../support/citus'
import { startProvider, startServer, type ProviderHandle, type ServerProcess } from '../support/server'
import { waitFor } from '../support/wait'
import { exactlyOnceProblems, leftProcessing, runLoad, serverErrors, tally, type Attempt } from './support/load'
import { apiKeys, tenantsOn, workerOf } from './support/tenants'

const SHARDS = 8

let cluster: CitusCluster
let db: CitusDatabase
let sql: postgres.Sql
let provider: ProviderHandle
let server: ServerProcess
/** One tenant on each shard. */
let tenants: string[]

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('rebalance', { shardCount: SHARDS })
  await migrateService(db.url)
  sql = postgres(db.url, { max: 4, onnotice: () => undefined })
  tenants = [...(await tenantsOn(sql, cluster.workers.map((w) => w.port), SHARDS / 2)).values()].flat()
  provider = await startProvider({ delayMs: 20 })
  server = await startServer(db.url, { API_KEYS: apiKeys(tenants) }, { provider })
}, 120_000)

afterAll(async () => {
  await server?.stop()
  await provider?.stop()
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

test('an online rebalance onto a third worker under load (logical mode): 0 5xx, one payment and one charge per key, nothing stuck', async () => {
  expect(await isCitus(sql)).toBe(true)
  const attempts: Attempt[] = []
  const load = runLoad({ url: () => server.url, attempts, pauseMs: 200 }, tenants, 1, 'move')
  await waitFor(() => tenants.every((t) => load.paid(t) >= 3), () => `every tenant paid 3 keys before the rebalance (${tenants.map((t) => load.paid(t))})`, 30_000)

  const before = new Map(await Promise.all(tenants.map(async (t) => [t, await workerOf(sql, t)] as const)))
  const third = await cluster.addWorker()
  const rebalanceStarted = performance.now()
  const paidAtStart = new Map(tenants.map((t) => [t, load.paid(t)]))
  const [job] = await sql<{ id: string }[]>`select citus_rebalance_start(shard_transfer_mode => 'force_logical')::text as id`
  expect(job!.id).toBeTruthy()
  // Returns when the background job has ended; raises if it failed.
  await sql`select citus_rebalance_wait()`
  const rebalanceMs = performance.now() - rebalanceStarted
  const [status] = await sql<{ state: string; details: unknown }[]>`select state::text, details from citus_rebalance_status()`
  expect(status!.state).toBe('finished')

  const after = new Map(await Promise.all(tenants.map(async (t) => [t, await workerOf(sql, t)] as const)))
  const moved = tenants.filter((t) => after.get(t) !== before.get(t))
  expect(moved.length).toBeGreaterThan(0)
  expect(moved.every((t) => after.get(t) === third.port)).toBe(true)
  const paidDuring = new Map(moved.map((t) => [t, load.paid(t) - paidAtStart.get(t)!]))
  // The moved tenants go on paying on their new worker.
  const paidAtEnd = new Map(tenants.map((t) => [t, load.paid(t)]))
  await waitFor(() => moved.every((t) => load.paid(t) - paidAtEnd.get(t)! >= 3), () => `the moved tenants to pay 3 keys after the rebalance`, 30_000)
  await load.stop()

  console.log(`citus rebalance: ${Math.round(rebalanceMs)} ms, moved ${moved.length} of ${tenants.length} tenants' shards onto the third worker; `
    + `their payments during the move ${JSON.stringify([...paidDuring])}; ${load.keys.size} keys; answers ${JSON.stringify(tally(attempts))}; `
    + `5xx ${JSON.stringify(serverErrors(attempts).slice(0, 5))}`)

  // Load met the moves: every moved tenant paid while its shard was being moved.
  expect([...paidDuring.values()].every((n) => n > 0)).toBe(true)
  expect(await exactlyOnceProblems(sql, provider.url, load.keys, attempts)).toEqual([])
  expect(await leftProcessing(sql)).toEqual({ keys: 0, listed: 0 })
  expect(serverErrors(attempts, true)).toEqual([])
}, 120_000)
