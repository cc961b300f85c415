/**
 * A server started while a worker is down. The start wrote the settings record
 * (a reference table: a copy on every node, a write needs them all), so with one
 * worker down no server could start, those for the other workers' tenants
 * included. Now it starts, whether its settings are those recorded or new ones
 * (then warned, and recorded by a later start); it pays the tenants of the
 * worker that is up (one payment, one charge per key), answers the down
 * worker's tenants with a 5xx problem that charged nothing, and pays them once
 * the worker is back.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import type { CitusCluster, CitusDatabase } from '../support/citus'
import { chargesAt, startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { exactlyOnceProblems, payUntilAnswered, customerOf, type Attempt } from './support/load'
import { apiKeyOf, apiKeys } from './support/tenants'
import { startTwoWorkers } from './support/two-workers'

let cluster: CitusCluster
let db: CitusDatabase
let sql: postgres.Sql
let provider: GatedProvider
let downTenant: string
let upTenant: string
let env: Record<string, string>
const servers: ServerProcess[] = []

beforeAll(async () => {
  let placed: { downTenants: string[]; upTenants: string[] }
  ;({ cluster, db, sql, ...placed } = await startTwoWorkers('start_worker_down', 1))
  downTenant = placed.downTenants[0]!
  upTenant = placed.upTenants[0]!
  provider = await startGatedProvider({ delayMs: 20 })
  env = { API_KEYS: apiKeys([downTenant, upTenant]), IDEMPOTENCY_TTL_SECONDS: '30' }
  // A first start with every node up records the settings.
  const first = await startServer(db.url, env, { provider })
  expect(await first.stop()).toBe(0)
}, 120_000)

afterAll(async () => {
  await Promise.all(servers.map((server) => server.stop()))
  await provider?.stop()
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

async function recorded(): Promise<number> {
  const [row] = await sql<{ ttl_seconds: number }[]>`select ttl_seconds from idempotency_settings where id = 1`
  return row!.ttl_seconds
}

async function post(server: ServerProcess, tenant: string, key: string): Promise<Response> {
  return await fetch(`${server.url}/api/payments`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKeyOf(tenant)}`, 'idempotency-key': key },
    body: JSON.stringify({ amount: 1500, currency: 'EUR', customer: customerOf(key) }),
  })
}

test('with a worker down, a server starts (its settings recorded or new), pays the other worker\'s tenant, refuses the down one\'s without charging, and pays it once the worker is back', async () => {
  const [down] = cluster.workers
  await down!.stop()

  // The same settings as recorded: nothing to write.
  const same = await startServer(db.url, env, { provider })
  servers.push(same)
  // New ones: recorded by a later start, and said so.
  const changed = await startServer(db.url, { ...env, IDEMPOTENCY_TTL_SECONDS: '45' }, { provider })
  servers.push(changed)
  expect(changed.output()).toContain('could not be recorded: a node is unreachable')
  expect(await recorded()).toBe(30)

  const attempts: Attempt[] = []
  const keys = new Map<string, string>()
  for (const [n, server] of [same, changed].entries()) {
    const key = `up-${n}-${crypto.randomUUID()}`
    keys.set(key, upTenant)
    await payUntilAnswered({ url: () => server.url, attempts }, upTenant, key, 1500, 30_000)
    expect(attempts.at(-1)!.status).toBe(201)
    expect(attempts.filter((a) => a.key === key)).toHaveLength(1) // at the first attempt
  }

  // The down worker's tenant: a 5xx problem, and no charge.
  const refusedKey = `down-${crypto.randomUUID()}`
  const refused = await post(same, downTenant, refusedKey)
  expect(refused.status).toBeGreaterThanOrEqual(500)
  expect(refused.headers.get('content-type')).toContain('application/problem+json')
  expect(await chargesAt(provider.url, customerOf(refusedKey))).toEqual([])

  await down!.start()
  keys.set(refusedKey, downTenant)
  await payUntilAnswered({ url: () => same.url, attempts }, downTenant, refusedKey, 1500, 30_000)
  expect(await exactlyOnceProblems(sql, provider.url, keys, attempts)).toEqual([])

  // With every node up, a start with the new settings records them.
  const later = await startServer(db.url, { ...env, IDEMPOTENCY_TTL_SECONDS: '45' }, { provider })
  servers.push(later)
  expect(later.output()).not.toContain('could not be recorded')
  expect(await recorded()).toBe(45)
}, 120_000)
