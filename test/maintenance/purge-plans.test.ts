/**
 * The purge's batch on a table of the new form with its statistics
 * (sql/engine/00020): it reaches the keys and their answers by their indexes,
 * never the answer table whole, and deletes each key's answer with it.
 *
 * Read through a join whose row count the planner guessed from a CASE, the
 * batch hashed the whole answer table: 1.06-1.17 s a batch at 2 M keys and
 * 4.9 s at 10 M (each run's first batch, which starts from the oldest key), so
 * bench:day's purge cleared nothing while it served; 5 ms since
 * (BENCHMARKS.md). At the 30,000 keys here the planner did not make that
 * choice with the join either: bench:day is what shows it.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { purgeExpiredBatch, PURGE_BATCH_SIZE } from '../../src/core/purge'
import { createTestDatabase, setKeyForm, type TestDatabase } from '../support/db'
import { createKeys, secondsBefore } from '../support/keys'
import { capturePlans, type PlanCapture } from '../support/plans'

const RETENTION = 3600
const EXPIRED = 20_000
const KEPT = 10_000

let db: TestDatabase
let capture: PlanCapture
beforeAll(async () => {
  db = await createTestDatabase('purge_plans')
  await setKeyForm(db.url, 'new')
  const now = new Date()
  await createKeys(db.sql, EXPIRED, { prefix: 'expired-', status: 'done', lockedAt: secondsBefore(now, RETENTION + 601), completedAt: secondsBefore(now, RETENTION + 600) })
  await createKeys(db.sql, KEPT, { prefix: 'kept-', status: 'done', completedAt: secondsBefore(now, 60) })
  await db.sql`vacuum analyze idempotency_keys, idempotency_answers`
  capture = capturePlans(db.url)
})
afterAll(async () => {
  await capture?.pools.close()
  await db?.drop()
})

test('a batch from the oldest key probes the answers of the keys it reaches, on a table of the new form with statistics', async () => {
  const [form] = await db.sql<{ apart: number }[]>`select count(*)::int as apart from idempotency_keys where digest is not null`
  expect(form!.apart).toBe(EXPIRED + KEPT)
  const batch = await purgeExpiredBatch(capture.pools.short, { retentionSeconds: RETENTION })
  expect(batch.deleted).toBe(PURGE_BATCH_SIZE)
  const accesses = capture.accesses(['idempotency_keys', 'idempotency_answers'])
  console.log([...new Set(accesses.map((a) => `${a.table}: ${a.node}${a.index ? ` ${a.index}` : ''}${a.probed ? '' : ' (whole)'}`))].join('\n'))
  expect(accesses.filter((a) => a.table === 'idempotency_answers').length).toBeGreaterThan(0)
  // By an index, or by the row's address (the delete of the rows the batch locked).
  expect(accesses.filter((a) => !a.probed || (a.index === undefined && a.node !== 'Tid Scan'))).toEqual([])
  // Its answers went with the keys, and only theirs.
  const [left] = await db.sql<{ keys: number; answers: number }[]>`
    select (select count(*)::int from idempotency_keys) as keys, (select count(*)::int from idempotency_answers) as answers`
  expect(left).toEqual({ keys: EXPIRED + KEPT - PURGE_BATCH_SIZE, answers: EXPIRED + KEPT - PURGE_BATCH_SIZE })
})
