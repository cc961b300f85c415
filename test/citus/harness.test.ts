/**
 * The cluster harness itself (test/support/citus.ts): a coordinator and two
 * workers that distribute a table, a worker stopped and started again, a
 * third worker added, and nothing left behind by stop.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { existsSync } from 'node:fs'
import postgres from 'postgres'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../support/citus'

let cluster: CitusCluster
let db: CitusDatabase
let sql: postgres.Sql

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('harness', { shardCount: 4 })
  sql = postgres(db.url, { max: 2, onnotice: () => undefined })
}, 120_000)

afterAll(async () => {
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

describe('the Citus test harness', () => {
  test('a fresh database has the coordinator and both workers, and distributes a table over the workers', async () => {
    const nodes = await sql<{ groupid: number; nodeport: number }[]>`select groupid, nodeport from pg_dist_node order by groupid`
    expect(nodes.map((n) => n.nodeport)).toEqual([cluster.coordinator.port, ...cluster.workers.map((w) => w.port)])
    await sql`create table t (tenant text, id int, primary key (tenant, id))`
    await sql`select create_distributed_table('t', 'tenant')`
    await sql`insert into t select 'tenant-' || g, g from generate_series(1, 100) g`
    const placements = await sql<{ nodeport: number; n: number }[]>`
      select nodeport, count(*)::int as n from pg_dist_shard_placement join pg_dist_shard using (shardid)
      where logicalrelid = 't'::regclass group by nodeport order by nodeport`
    expect(placements.map((p) => p.nodeport).sort()).toEqual(cluster.workers.map((w) => w.port).sort())
    expect((await sql`select count(*)::int as n from t`)[0]!.n).toBe(100)
  })

  test('a worker stopped and started again serves its shards again', async () => {
    const worker = cluster.workers[0]!
    await worker.stop()
    expect(worker.running).toBe(false)
    await expect(sql`select count(*)::int as n from t`).rejects.toThrow()
    await worker.start()
    expect((await sql`select count(*)::int as n from t`)[0]!.n).toBe(100)
  })

  test('a worker added joins every database made so far, and a rebalance moves shards onto it', async () => {
    const third = await cluster.addWorker()
    const [node] = await sql<{ n: number }[]>`select count(*)::int as n from pg_dist_node where nodeport = ${third.port}`
    expect(node!.n).toBe(1)
    await sql`select rebalance_table_shards(shard_transfer_mode => 'force_logical')`
    const [moved] = await sql<{ n: number }[]>`
      select count(*)::int as n from pg_dist_shard_placement where nodeport = ${third.port}`
    expect(moved!.n).toBeGreaterThan(0)
    expect((await sql`select count(*)::int as n from t`)[0]!.n).toBe(100)
  }, 120_000)

  test('stop ends every node and removes the directory', async () => {
    const other = await startCitusCluster({ workers: 1 })
    expect(existsSync(other.home)).toBe(true)
    await other.stop()
    expect(existsSync(other.home)).toBe(false)
    expect(other.coordinator.running).toBe(false)
    expect(other.workers[0]!.running).toBe(false)
  }, 120_000)
})
