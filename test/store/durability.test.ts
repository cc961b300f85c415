/**
 * The start-up durability check (src/store/durability.ts): a database that
 * acknowledges commits before any standby has them is said so at start, in a
 * warning and in the gauge idempotency_database_commit_unreplicated. The
 * test server has no standby (synchronous_standby_names is empty), so it is
 * such a database; the replicated case (gauge 0) is the Patroni scenario's
 * (test/scale/patroni.scale.ts), the only place with a synchronous standby.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { Registry } from 'prom-client'
import { createLogger } from '../../src/log'
import { COMMIT_UNREPLICATED_METRIC, readDurability, watchDurability } from '../../src/store/durability'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startServer } from '../support/server'
import { waitFor } from '../support/wait'

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('durability') })
afterAll(() => db?.drop())

describe('readDurability', () => {
  test('no synchronous standby named: unreplicated, says why', async () => {
    const [{ names }] = await db.sql<{ names: string }[]>`select current_setting('synchronous_standby_names') as names` as unknown as [{ names: string }]
    expect(names).toBe('') // the premise: this server waits for no standby
    const d = await readDurability(db.sql)
    expect(d).toMatchObject({ unreplicated: true, synchronousCommit: 'on', synchronousStandbyNames: '' })
    expect(d.reason).toContain('synchronous_standby_names is empty')
  })

  test('synchronous_commit = local in the service\'s own session counts (e.g. set on its role)', async () => {
    const local = postgres(db.url, { max: 1, connection: { synchronous_commit: 'local' } as never, onnotice: () => undefined })
    try {
      const d = await readDurability(local)
      expect(d).toMatchObject({ unreplicated: true, synchronousCommit: 'local' })
      expect(d.reason).toContain('synchronous_commit = local')
    } finally {
      await local.end({ timeout: 1 })
    }
  })
})

test('watchDurability logs one warning for a state that lasts, and sets the gauge to 1', async () => {
  const lines: string[] = []
  const registry = new Registry()
  let readings = 0
  const counted = ((strings: TemplateStringsArray, ...values: never[]) => { readings++; return db.sql(strings, ...values) }) as unknown as postgres.Sql
  const watch = watchDurability({ sql: counted, registry, log: createLogger({ sink: (line) => lines.push(line) }), intervalMs: 20 })
  try {
    await waitFor(async () => readings >= 5 && (await registry.metrics()).includes(`${COMMIT_UNREPLICATED_METRIC} 1`), 'five readings and the gauge at 1')
    expect(lines.filter((l) => l.includes('a failover may lose acknowledged payments'))).toHaveLength(1)
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: 'warn', synchronous_standby_names: '' })
  } finally {
    watch.stop()
  }
})

test('on the embedded single node it says so at info, without the failover warning; the gauge is still 1', async () => {
  const lines: string[] = []
  const registry = new Registry()
  const watch = watchDurability({ sql: db.sql, registry, log: createLogger({ sink: (line) => lines.push(line) }), intervalMs: 20, singleNode: true })
  try {
    await waitFor(async () => (await registry.metrics()).includes(`${COMMIT_UNREPLICATED_METRIC} 1`) && lines.length > 0, 'the gauge at 1 and the line')
    expect(lines.filter((l) => l.includes('a failover may lose acknowledged payments'))).toEqual([])
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: 'info', msg: expect.stringContaining('single node') })
  } finally {
    watch.stop()
  }
})

test('the service warns at start and exports the gauge', async () => {
  const server = await startServer(db.url)
  try {
    await waitFor(() => server.output().includes('a failover may lose acknowledged payments'), 'the start-up warning')
    const metrics = await (await fetch(`${server.url}/metrics`)).text()
    expect(metrics).toContain(`# TYPE ${COMMIT_UNREPLICATED_METRIC} gauge`)
    expect(metrics).toContain(`${COMMIT_UNREPLICATED_METRIC} 1`)
  } finally {
    await server.stop()
  }
})
