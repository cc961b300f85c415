/**
 * Exactly once under a storm on the distributed schema (issue 47): one key ×
 * 300 concurrent requests over real HTTP, against the service as a process
 * on a Citus coordinator with two workers, for a tenant on each worker. The
 * first charge is held at the provider until every other request of the
 * storm has its answer, so all 300 land while the key is processing. Two
 * service processes share the storm: a retry landing on the process that
 * runs its key is answered from memory (http/running-keys.ts), one landing
 * on the other process claims, on the tenant's worker.
 * Counts at the provider's ledger and in payments: one each; the rest 409
 * (SPEC: the same key while the first is processing), none 5xx.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { isCitus } from '../../src/store/citus'
import { migrateService } from '../../src/store/migrate'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../support/citus'
import { payment, postPayment } from '../support/http'
import { startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { waitFor } from '../support/wait'
import { apiKeyOf, apiKeys, tenantsOn } from './support/tenants'

const STORM = 300

let cluster: CitusCluster
let db: CitusDatabase
let sql: postgres.Sql
let provider: GatedProvider
/** Two processes on one database, the storm split between them. */
let servers: ServerProcess[]
/** One tenant on each worker. */
let tenants: string[]

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('storm', { shardCount: 8 })
  await migrateService(db.url)
  sql = postgres(db.url, { max: 4, onnotice: () => undefined })
  tenants = [...(await tenantsOn(sql, cluster.workers.map((w) => w.port), 1)).values()].flat()
  provider = await startGatedProvider()
  const env = { API_KEYS: apiKeys(tenants) }
  servers = await Promise.all([startServer(db.url, env, { provider }), startServer(db.url, env, { provider })])
}, 120_000)

afterAll(async () => {
  await Promise.all((servers ?? []).map((s) => s.stop()))
  await provider?.stop()
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

interface Answer { status: number; id?: string; replayed: boolean; retryAfter: string | null; problem?: string }

test(`one key × ${STORM} concurrent requests, on each worker's tenant: one payment, one charge, the rest 409, no 5xx`, async () => {
  expect(await isCitus(sql)).toBe(true)
  for (const tenant of tenants) {
    const key = `storm-${crypto.randomUUID()}`
    const customer = `cus_storm_${tenant}`
    provider.hold(1)
    let answered = 0
    const stormed = Promise.all(Array.from({ length: STORM }, async (_, i): Promise<Answer> => {
      const response = await postPayment(servers[i % servers.length]!.url, payment({ customer }), { key, apiKey: apiKeyOf(tenant) })
      const text = await response.text()
      answered++
      const parsed = JSON.parse(text) as { id?: string; code?: string; detail?: string }
      return {
        status: response.status,
        ...(response.ok ? { id: parsed.id! } : { problem: `${parsed.code}: ${parsed.detail}` }),
        replayed: response.headers.get('idempotent-replayed') === 'true',
        retryAfter: response.headers.get('retry-after'),
      }
    }))
    await waitFor(() => answered === STORM - 1 && provider.held() === 1,
      () => `${STORM - 1} of ${STORM} requests of ${tenant} answered while the first is held at the provider (${answered} so far, ${provider.held()} held)`, 45_000)
    provider.release()
    const answers = await stormed
    const created = answers.filter((a) => a.status === 201)
    const conflicts = answers.filter((a) => a.status === 409)
    console.log(`citus storm ${tenant}: ${created.length}x201, ${conflicts.length}x409, others: ${answers.filter((a) => a.status !== 201 && a.status !== 409).map((a) => `${a.status} ${a.problem}`).join(', ') || 'none'}`)

    expect(answers.filter((a) => a.status >= 500)).toEqual([])
    expect(created.length + conflicts.length).toBe(STORM)
    expect(created.filter((a) => !a.replayed)).toHaveLength(1)
    expect(conflicts.every((a) => Number(a.retryAfter) >= 1)).toBe(true)
    const rows = await sql<{ id: string; provider_ref: string }[]>`
      select id::text, provider_ref from payments where tenant = ${tenant} and idempotency_key = ${key}`
    expect(rows).toHaveLength(1)
    expect(created.map((a) => a.id)).toEqual([rows[0]!.id])
    // Exactly once where it counts: one charge at the provider, the one the payment names.
    expect((await provider.charges(customer)).map((c) => c.id)).toEqual([rows[0]!.provider_ref])
    // The key is done and off the processing list (the first trial's completion left it listed).
    const [state] = await sql<{ status: string; listed: number }[]>`
      select status, (select count(*)::int from idempotency_processing where tenant = ${tenant} and key = ${key}) as listed
        from idempotency_key_states where tenant = ${tenant} and key = ${key}`
    expect(state).toEqual({ status: 'done', listed: 0 })
    // A retry after the storm is a replay of the same payment, at either process (one may say 409 for
    // http/busy-keys.ts's 250 ms after the run ended, as its Retry-After allows: then the next retry replays).
    for (const srv of servers) {
      const seen: number[] = []
      let last: { status: number; replayed: boolean; id: string | undefined } | undefined
      await waitFor(async () => {
        const again = await postPayment(srv.url, payment({ customer }), { key, apiKey: apiKeyOf(tenant) })
        last = { status: again.status, replayed: again.headers.get('idempotent-replayed') === 'true', id: ((await again.json()) as { id?: string }).id }
        seen.push(again.status)
        return again.status !== 409
      }, () => `a retry of ${key} after the storm to be answered other than 409 (${seen})`, 10_000, 100)
      expect(last).toEqual({ status: 201, replayed: true, id: rows[0]!.id })
    }
  }
}, 90_000)
