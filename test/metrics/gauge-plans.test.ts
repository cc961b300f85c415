import { afterAll, beforeAll, expect, test } from 'bun:test'
import { DUPLICATE_WINDOW_KEYS, DUPLICATE_WINDOW_SECONDS } from '../../src/metrics/gauges'
import { DUPLICATES_SQL, duplicatesParameters, readDuplicates } from '../../src/metrics/read-duplicates'
import { PROCESSING_GAUGES_SQL, processingGaugeParameters, readProcessingGauges } from '../../src/metrics/read-processing-gauges'
import { PURGE_OVERDUE_SQL, purgeOverdueParameters, readPurgeOverdue } from '../../src/metrics/read-purge-overdue'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { seedKeys } from './seed'

/**
 * The gauge queries must stay cheap however many completed keys wait for
 * their retention: they may read the partial indexes, never the whole table.
 * 200k keys are enough for the planner to cost them like production (on a
 * small table a seq scan is chosen, and is then the right choice).
 */
const DONE = 200_000
const PROCESSING = 40
/** The clock of the whole file: the seed and every query take it, so nothing depends on when the test runs. */
const NOW = new Date('2030-01-01T12:00:00Z')

let db: TestDatabase
beforeAll(async () => {
  // Seeded once into a template (about 4 s on an idle machine), then copied for each run.
  const key = `gauge-plans ${DONE} ${PROCESSING} ${NOW.toISOString()} ${seedKeys.toString()}`
  db = await createTestDatabase('gauge_plans', { seed: { key, fill: (sql) => seedKeys(sql, DONE, PROCESSING, NOW) } })
}, 60_000)
afterAll(async () => { await db?.drop() })

interface PlanNode { 'Node Type': string; 'Relation Name'?: string; 'Index Name'?: string; 'Scan Direction'?: string; Plans?: PlanNode[] }

function nodes(plan: PlanNode): PlanNode[] {
  return [plan, ...(plan.Plans ?? []).flatMap(nodes)]
}

async function scansOf(sql: string, params: unknown[], table = 'idempotency_keys'): Promise<PlanNode[]> {
  const [row] = await db.sql.unsafe(`explain (format json) ${sql}`, params as never[])
  const plan = (row!['QUERY PLAN'] as { Plan: PlanNode }[])[0]!.Plan
  const scans = nodes(plan).filter((node) => node['Relation Name'] === table)
  console.log(scans.map((node) => `${node['Node Type']} ${node['Index Name'] ?? ''}`).join('\n'))
  return scans
}

test('the stale-key and oldest-age query never reads the keys table: only the processing list, the stale count by its deadline', async () => {
  expect(await scansOf(PROCESSING_GAUGES_SQL, processingGaugeParameters(NOW))).toEqual([])
  const scans = await scansOf(PROCESSING_GAUGES_SQL, processingGaugeParameters(NOW), 'idempotency_processing')
  // A few hundred rows at most: the planner may read them whole; what matters is that 1M done keys are never read.
  expect(scans.length).toBe(2)
})

/** A new-form key's answer (sql/engine/00020) is read by its primary key, one key at a time: never the answer table whole. */
async function expectAnswersProbed(sql: string, params: unknown[]): Promise<void> {
  const scans = await scansOf(sql, params, 'idempotency_answers')
  expect(scans.map((scan) => [scan['Node Type'], scan['Index Name']])).toEqual(scans.map(() => ['Index Scan', 'idempotency_answers_pkey']))
}

test('the seed is in the database\'s key form', async () => {
  const [row] = await db.sql<{ answers: number; apart: boolean }[]>`
    select (select count(*)::int from idempotency_answers) as answers, (select form = 'new' from idempotency_key_form) as apart`
  expect(row!.answers).toBe(row!.apart ? DONE : 0)
})

test('the duplicates query reads only the recent window of the created_at index, newest first, and stops at its bound', async () => {
  const scans = await scansOf(DUPLICATES_SQL, duplicatesParameters(DUPLICATE_WINDOW_SECONDS, 30, DUPLICATE_WINDOW_KEYS, NOW))
  await expectAnswersProbed(DUPLICATES_SQL, duplicatesParameters(DUPLICATE_WINDOW_SECONDS, 30, DUPLICATE_WINDOW_KEYS, NOW))
  expect(scans.length).toBe(1)
  expect(scans[0]!['Node Type']).not.toBe('Seq Scan')
  expect(scans[0]!['Index Name']).toBe('idempotency_keys_created_at')
  expect(scans[0]!['Scan Direction']).toBe('Backward')
})

test('past its bound the duplicates query counts the newest keys only, and says how many seconds they cover', async () => {
  // Keys 0.432 s apart (200k over a day), and the 40 processing ones among the newest: the 2,500th newest is done key 2,460.
  const { byTenant, coveredSeconds } = await readDuplicates(db.pools.short, DUPLICATE_WINDOW_SECONDS, 30, 2_500, NOW)
  // Keys 1,001 and 2,001 repeat the key before them; the hour's six others (3,001 to 8,001) are past the bound.
  expect([...byTenant.values()].reduce((sum, n) => sum + n, 0)).toBe(2)
  expect(coveredSeconds).toBeCloseTo(2_460 * 86_400 / DONE, 3)
  // Within the bound, the whole window.
  expect((await readDuplicates(db.pools.short, DUPLICATE_WINDOW_SECONDS, 30, DUPLICATE_WINDOW_KEYS, NOW)).coveredSeconds).toBe(DUPLICATE_WINDOW_SECONDS)
})

test('the purge-overdue query reads the created_at index from the oldest, and stops at the first key past retention', async () => {
  for (const retention of [3_600, 86_400]) {
    const scans = await scansOf(PURGE_OVERDUE_SQL, purgeOverdueParameters(retention, NOW))
    expect(scans.map((scan) => [scan['Node Type'], scan['Index Name'], scan['Scan Direction']])).toEqual([['Index Scan', 'idempotency_keys_created_at', 'Forward']])
    await expectAnswersProbed(PURGE_OVERDUE_SQL, purgeOverdueParameters(retention, NOW))
  }
  // Keys 0.432 s apart over the day before NOW: with an hour's retention the oldest (a day old) is 82,800 s past it.
  expect(await readPurgeOverdue(db.pools.short, 3_600, NOW)).toBeCloseTo(86_400 - 3_600, 0)
  expect(await readPurgeOverdue(db.pools.short, 86_400 * 2, NOW)).toBe(0)
})

test('on the seeded table the gauges count what was seeded', async () => {
  const { staleByTenant, oldestAgeSeconds } = await readProcessingGauges(db.pools.short, NOW)
  // stuck-i has been locked i * 10 s: stuck-1 and stuck-2 are younger than the 30 s TTL (stuck-3, exactly 30 s, is stale)
  expect(staleByTenant.get('acme')).toBe(PROCESSING - 2)
  expect(oldestAgeSeconds).toBeGreaterThanOrEqual(PROCESSING * 10)
  expect(oldestAgeSeconds).toBe(PROCESSING * 10)
  // one repeat per 1000 requests over 24 h: about 200 / 24 of them in the last hour
  const { byTenant } = await readDuplicates(db.pools.short, DUPLICATE_WINDOW_SECONDS, 30, DUPLICATE_WINDOW_KEYS, NOW)
  const total = [...byTenant.values()].reduce((sum, n) => sum + n, 0)
  expect(total).toBeGreaterThan(0)
  expect(total).toBeLessThan(DONE / 1000 / 24 * 2)
  // exactly: key i (i = 1001, 2001, ...) repeats key i - 1, and both completed within the window before NOW
  let repeatsInWindow = 0
  for (let i = 1001; i <= DONE; i += 1000) if ((i / DONE) * 86_400 < DUPLICATE_WINDOW_SECONDS) repeatsInWindow++
  expect(total).toBe(repeatsInWindow)
})
