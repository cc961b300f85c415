/**
 * docs/how-to/citus.md's SQL, run as written (only host names and ports
 * replaced by this cluster's): every block marked `<!-- citus-doc: NODE -->`,
 * in the order of the page, on every node or on the coordinator, with the
 * steps the page says in words between them (the service's migrations, a
 * third worker started). A block that stops working fails here.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { migrateService, statementsOf } from '../../src/store/migrate'
import { startCitusCluster, type CitusCluster, type CitusDatabase, type CitusNode } from '../support/citus'

const PAGE = join(import.meta.dir, '..', '..', 'docs', 'how-to', 'citus.md')

interface Block { readonly where: 'every-node' | 'coordinator'; readonly sql: string }

function blocksOf(text: string): Block[] {
  return [...text.matchAll(/<!-- citus-doc: (every-node|coordinator) -->\n```sql\n([\s\S]*?)```/g)]
    .map((match) => ({ where: match[1] as Block['where'], sql: match[2]! }))
}

let cluster: CitusCluster
let db: CitusDatabase

beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
  db = await cluster.createDatabase('howto', { plain: true, shardCount: 4 })
}, 120_000)

afterAll(async () => {
  await cluster?.stop()
})

async function run(node: CitusNode, text: string, hosts: Record<string, CitusNode>): Promise<postgres.Row[]> {
  const local = Object.entries(hosts).reduce((sql, [name, host]) => sql.replaceAll(`'${name}', 5432`, `'127.0.0.1', ${host.port}`), text)
  const sql = postgres(node.urlOf(db.name), { max: 1, onnotice: () => undefined })
  try {
    // One statement at a time, as psql sends them: several in one query string would be one transaction, and
    // citus_rebalance_wait() would wait for a job that citus_rebalance_start() has not committed.
    let rows: postgres.Row[] = []
    for (const statement of statementsOf(local)) rows = [...await sql.unsafe(statement)]
    return rows
  } finally {
    await sql.end({ timeout: 1 })
  }
}

test('every SQL block of docs/how-to/citus.md runs as written, in order, and does what the page says', async () => {
  const blocks = blocksOf(readFileSync(PAGE, 'utf8'))
  expect(blocks.map((block) => block.where)).toEqual(['every-node', 'coordinator', 'coordinator', 'coordinator', 'coordinator'])
  const [extension, nodes, layout, rebalance, tenant] = blocks as [Block, Block, Block, Block, Block]
  const hosts: Record<string, CitusNode> = { coordinator: cluster.coordinator, worker1: cluster.workers[0]!, worker2: cluster.workers[1]! }

  for (const node of [cluster.coordinator, ...cluster.workers]) await run(node, extension.sql, hosts)
  const joined = await run(cluster.coordinator, nodes.sql, hosts)
  expect(joined.map((row) => [row.nodeport, row.groupid])).toEqual([[cluster.coordinator.port, 0], [cluster.workers[0]!.port, 1], [cluster.workers[1]!.port, 2]])

  // "Start the service with DATABASE_URL at the coordinator": its migrations.
  await migrateService(db.url)
  const tables = await run(cluster.coordinator, layout.sql, hosts)
  expect(tables.map((row) => [row.table_name, row.partmethod])).toEqual([
    ['idempotency_answers', 'h'], ['idempotency_audit', 'h'], ['idempotency_key_form', 'n'], ['idempotency_keys', 'h'],
    ['idempotency_processes', 'n'], ['idempotency_processing', 'h'], ['idempotency_settings', 'n'], ['payments', 'h'],
  ])
  expect(new Set(tables.filter((row) => row.partmethod === 'h').map((row) => row.colocationid)).size).toBe(1)

  // A third worker, started (its database and extension made), added and filled by the page's rebalance.
  hosts.worker3 = await cluster.addWorker()
  const [state] = await run(cluster.coordinator, rebalance.sql, hosts)
  expect(state!.state).toBe('finished')
  const coordinator = postgres(db.url, { max: 1, onnotice: () => undefined })
  try {
    const [placed] = await coordinator<{ n: number }[]>`select count(*)::int as n from citus_shards where nodeport = ${hosts.worker3.port}`
    expect(placed!.n).toBeGreaterThan(0)
  } finally {
    await coordinator.end({ timeout: 1 })
  }

  const isolated = await run(cluster.coordinator, tenant.sql, hosts)
  expect(isolated.length).toBe(1) // the new shard's id
}, 180_000)
