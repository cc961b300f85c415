/**
 * Readiness on a Citus coordinator (store/health.ts): a worker the coordinator
 * cannot reach is named (the log, /readyz), while the server stays ready, as it
 * still serves the tenants of the other workers; with no worker reachable it
 * is not ready; both come back when the workers do.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { openPools } from '../../src/store/db'
import { DatabaseHealth } from '../../src/store/health'
import { startApp } from '../support/app'
import { migrateService } from '../../src/store/migrate'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../support/citus'
import { waitFor } from '../support/wait'
import type { Logger } from '../../src/log'

let cluster: CitusCluster
let db: CitusDatabase
const lines: string[] = []
const log = { info: () => undefined, warn: (line: string) => { lines.push(line) }, error: () => undefined, debug: () => undefined } as unknown as Logger

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('readiness', { shardCount: 4 })
  await migrateService(db.url)
}, 120_000)

afterAll(async () => {
  await cluster?.stop()
})

test('a stopped worker is named unreachable while the server stays ready; with none left it is not ready; both come back', async () => {
  const health = new DatabaseHealth(db.url, 'test:citus-readiness', { log })
  const pools = openPools(db.url, { applicationName: 'test:citus-readiness', shortMax: 2, workMax: 2 })
  const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
  const app = await startApp({ url: db.url, pools, sql, drop: async () => undefined }, { health })
  const readyz = async () => { const response = await app.fetch('/readyz'); return { status: response.status, body: await response.json() as unknown } }
  try {
    await waitFor(() => health.probe(), 'the first probe to succeed')
    expect(health.up).toBe(true)
    expect(health.unreachableWorkers).toEqual([])
    const [first, second] = cluster.workers as [typeof cluster.workers[0], typeof cluster.workers[0]]

    await first.stop()
    await waitFor(() => health.unreachableWorkers.length === 1, () => `the stopped worker to be named (named: ${health.unreachableWorkers.join(', ') || 'none'})`)
    expect(health.unreachableWorkers).toEqual([`127.0.0.1:${first.port}`])
    expect(health.up).toBe(true)
    expect(lines.some((line) => line.includes(`unreachable from the coordinator: 127.0.0.1:${first.port}`))).toBe(true)
    expect(await readyz()).toEqual({ status: 200, body: { status: 'ready', unreachable_workers: [`127.0.0.1:${first.port}`] } })

    await second.stop()
    await waitFor(() => !health.up, 'not ready with no worker reachable')
    expect((await readyz()).status).toBe(503)
    expect([...health.unreachableWorkers].sort()).toEqual([`127.0.0.1:${first.port}`, `127.0.0.1:${second.port}`].sort())

    await Promise.all([first.start(), second.start()])
    await waitFor(() => health.up && health.unreachableWorkers.length === 0, 'ready again with every worker reachable')
    expect(lines.at(-1)).toContain('every worker reachable again')
    expect(await readyz()).toEqual({ status: 200, body: { status: 'ready' } })
  } finally {
    await app.stop()
    await pools.close(1)
    await sql.end({ timeout: 1 })
    await health.close()
  }
}, 60_000)
