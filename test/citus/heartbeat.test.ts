/**
 * Heartbeats on Citus (core/processes.ts): idempotency_processes is a
 * reference table, read on the worker a claim is routed to. Written through
 * Citus, a beat needs every node: with one worker down every beat failed, and
 * after 10 s every live process looked gone on the healthy workers too. Each
 * beat now writes each node's copy on its own: with a worker down, the beat
 * succeeds and the copies on the coordinator and the other worker stay fresh.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { startHeartbeat } from '../../src/core/processes'
import { migrateService } from '../../src/store/migrate'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../support/citus'
import { waitFor } from '../support/wait'

let cluster: CitusCluster
let db: CitusDatabase
let sql: postgres.Sql

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('heartbeat', { shardCount: 4 })
  await migrateService(db.url)
  sql = postgres(db.url, { max: 2, onnotice: () => undefined })
}, 120_000)

afterAll(async () => {
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

/** The heartbeat of `id` as each node's copy has it (epoch ms), by node port; a node that cannot be asked is absent. */
async function beatsOf(id: string): Promise<Map<number, number>> {
  const nodes = [cluster.coordinator, ...cluster.workers].filter((node) => node.running)
  const beats = new Map<number, number>()
  for (const node of nodes) {
    const direct = postgres(node.urlOf(db.name), { max: 1, onnotice: () => undefined })
    try {
      // On a node, the reference table's copy is its placement: read it as Citus would there.
      const [row] = await direct<{ at: Date | null }[]>`select max(heartbeat_at) as at from idempotency_processes where id = ${id}`
      if (row?.at) beats.set(node.port, row.at.getTime())
    } finally {
      await direct.end({ timeout: 1 })
    }
  }
  return beats
}

test('with a worker down the beat succeeds, and the copies on the coordinator and the other worker stay fresh; the worker gets it back when it returns', async () => {
  const [down, up] = cluster.workers as [typeof cluster.workers[0], typeof cluster.workers[0]]
  const lines: string[] = []
  const heartbeat = await startHeartbeat(sql, { intervalMs: 3_600_000, leases: () => ['42'], log: (line) => lines.push(line) })
  try {
    const first = await beatsOf(heartbeat.id)
    expect([...first.keys()].sort()).toEqual([cluster.coordinator.port, down.port, up.port].sort())

    await down.stop()
    const before = await beatsOf(heartbeat.id)
    await waitFor(async () => {
      await heartbeat.beat()
      const now = await beatsOf(heartbeat.id)
      return now.get(up.port)! > before.get(up.port)! && now.get(cluster.coordinator.port)! > before.get(cluster.coordinator.port)!
    }, 'the beat to reach the coordinator and the worker still up')
    expect(lines.filter((line) => line.startsWith('heartbeat failed'))).toEqual([])
    const [leases] = await sql<{ leases: string[] }[]>`select leases::text[] as leases from idempotency_processes where id = ${heartbeat.id}`
    expect(leases!.leases).toEqual(['42'])

    await down.start()
    await heartbeat.beat()
    const after = await beatsOf(heartbeat.id)
    expect(after.get(down.port)).toBeGreaterThan(first.get(down.port)!)
  } finally {
    await heartbeat.stop()
  }
  // A clean stop removes the row from every copy.
  expect((await beatsOf(heartbeat.id)).size).toBe(0)
}, 60_000)
