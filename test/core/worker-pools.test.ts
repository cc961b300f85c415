/**
 * The pool per Citus worker (core/worker-pools.ts): which pool a tenant's
 * lane calls take, how long its worker is kept, and that one PostgreSQL never
 * gets one (no pool, no query). Its effect on a real cluster, a frozen worker
 * holding only its own pool, is test/citus/request-path.test.ts's.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { KNOWN_TENANTS_MAX, WorkerPools, type WorkerPool } from '../../src/core/worker-pools'
import type { Sql } from '../../src/core/types'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { identity } from '../support/keys'

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('worker_pools') })
afterAll(async () => { await db?.drop() })

test('on one PostgreSQL the lane opens no worker pool', async () => {
  const results = await Promise.all(['acme', 'globex', 'initech'].map((tenant) => claim(db.pools.short, identity({ tenant }), { ttlSeconds: 30, retentionSeconds: 3600 })))
  expect(results.map((r) => r.kind)).toEqual(['created', 'created', 'created'])
  expect(db.pools.workers!.workers).toEqual([])
})

/** A coordinator that answers the placement query from `placement`, counting the questions per tenant. */
function fakeCoordinator(placement: Map<string, string>) {
  const asked: string[] = []
  const sql = ((_strings: TemplateStringsArray, tenant: string) => {
    asked.push(tenant)
    return Promise.resolve([{ worker: placement.get(tenant)! }])
  }) as unknown as Sql
  return { sql, asked }
}

function fakeOpen() {
  const opened: string[] = []
  const open = (worker: string) => {
    opened.push(worker)
    return { worker, end: () => Promise.resolve() } as unknown as WorkerPool
  }
  return { open, opened }
}

const workerOfPool = (pool: WorkerPool) => (pool as unknown as { worker: string }).worker

test('each tenant takes the pool of its shard\'s worker, opened once, its worker asked once until forgotten', async () => {
  const placement = new Map([['a', 'w1:5432'], ['b', 'w2:5432'], ['c', 'w1:5432']])
  const coordinator = fakeCoordinator(placement)
  const { open, opened } = fakeOpen()
  const pools = new WorkerPools(coordinator.sql, open)
  expect(workerOfPool(await pools.poolOf('a'))).toBe('w1:5432')
  expect(workerOfPool(await pools.poolOf('b'))).toBe('w2:5432')
  expect(await pools.poolOf('c')).toBe(await pools.poolOf('a'))
  expect(opened).toEqual(['w1:5432', 'w2:5432'])
  expect(coordinator.asked).toEqual(['a', 'b', 'c'])

  // A shard moved (a call met 40001): the tenant's worker is asked again, and its new pool opened.
  placement.set('a', 'w3:5432')
  expect(workerOfPool(await pools.poolOf('a'))).toBe('w1:5432')
  pools.forget('a')
  expect(workerOfPool(await pools.poolOf('a'))).toBe('w3:5432')
  expect(opened).toEqual(['w1:5432', 'w2:5432', 'w3:5432'])
  expect(coordinator.asked).toEqual(['a', 'b', 'c', 'a'])
  await pools.close(1)
  await expect(pools.poolOf('new')).rejects.toThrow('closed')
})

test(`at most ${KNOWN_TENANTS_MAX} tenants are kept: the longest known is asked again`, async () => {
  const coordinator = fakeCoordinator(new Map())
  const pools = new WorkerPools(coordinator.sql, fakeOpen().open)
  for (let i = 0; i <= KNOWN_TENANTS_MAX; i++) await pools.poolOf(`t-${i}`)
  await pools.poolOf('t-1')
  await pools.poolOf('t-0')
  expect(coordinator.asked.slice(KNOWN_TENANTS_MAX + 1)).toEqual(['t-0'])
})
