/**
 * What a completed key costs on disk (issue 40): fresh payments through the
 * service, 32 at a time, then pg_total_relation_size of idempotency_keys and
 * idempotency_processing (heap, TOAST, indexes, maps) over the keys in `done`,
 * and the share of completions that stayed heap-only updates
 * (bench/key-bytes.ts measures the same at any size, and candidate layouts).
 *
 * 1,000 payments: the figure per key is within 5 % of the one after 4,000
 * (1,950 B against 1,847 B measured; fixed costs such as the maps' and the
 * indexes' first pages weigh a little more on fewer keys).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { pay, settledKeyBytes, type KeyBytes } from '../../bench/key-bytes'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { completeRows } from '../../src/core/complete-rows'
import { release } from '../../src/core/release'
import { openPools } from '../../src/store/db'
import { identity } from '../support/keys'
import { startApp } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'

const PAYMENTS = 1000
/** The new form (sql/engine/00020, claimed since 00023; TEST_KEY_FORM=old for the other): the answer apart, the lease on the processing entry. */
const apart = process.env.TEST_KEY_FORM !== 'old'
/**
 * The new form's entries carry the lease, owner and summary (about twice the
 * old form's), so its list's dead entries before the first vacuum weigh more:
 * 442 and 459 B a key in two runs on PostgreSQL 15 (2026-12-07; the old
 * form's 197-238 in the same runs and earlier ones), so a fifth above that.
 */
const NEW_FORM_LIST_BYTES = 560
/**
 * The new form's answers, a payment's: 459 B a key over these 1,000 (373
 * after 4,000 and 376 at 10 M, bench/key-bytes.ts and bench:day: the pages
 * every table starts with, about 115 KB of free-space map, BRIN and primary
 * key, weigh four times as much here). A stored location adds 65 B a key
 * (sql/engine/00025 derives it), so the bound lies between the two.
 */
const NEW_FORM_ANSWER_BYTES = 490

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('key_bytes') })
afterAll(async () => { await db?.drop() })

// Catches: a fillfactor that leaves the key pages half empty or no room for the completion (HOT lost), a processing
// list at a tenth of a page that keeps a dead row per payment until vacuum, an index or column that grows every key.
// Measured after 1,000 payments: 1,950 B a key with sql/engine/00010, 2,793 B without it (the list at 10 %, the keys at 30 %);
// 1,753-1,827 B with 00017 (the summary cleared at completion, the keys at 35 %), and 95 % HOT with the summary kept at 35 %;
// 1,524 B with 00018, the processing list's share 172 B where it was over 400 with the list at 25 % (a share that does not
// depend on how the requests were batched: the list's entries are only inserted and deleted). Engine 20 gave the list a
// partial index by key (the new form's, empty in the old): its pages are 16 B a key here, and PostgreSQL 14 put the
// share at 311 B (197-205 on 15 to 18), hence 330.
test(`${PAYMENTS} payments at 32 concurrent: at most 2,200 B of the key tables per completed key, 330 of them the processing list's, and at least 99 % of the completions HOT`, async () => {
  const app = await startApp(db)
  try {
    await pay(app, PAYMENTS, 32)
  } finally {
    await app.stop()
    await db.pools.close(1) // the backends report their counters as they exit
  }
  const figures: KeyBytes = await settledKeyBytes(db.sql, PAYMENTS)
  const per = (bytes: number) => Math.round(bytes / figures.done)
  console.log(`[key-bytes] ${figures.done} keys: ${Math.round(figures.perKey)} B a key (heap ${per(figures.heap)}, indexes ${per(figures.indexes)}, `
    + `processing list ${per(figures.processing)}, answers ${per(figures.answers)}, TOAST ${per(figures.toast)}, maps ${per(figures.maps)}); `
    + `${figures.rowsPerPage.toFixed(1)} rows a page of ${Math.round(figures.avgRow)} B; HOT ${figures.hot}/${figures.upd}`)
  expect(figures.done).toBe(PAYMENTS)
  if (apart) {
    // The new form's completion writes the answer and deletes the entry: the key row is never updated.
    expect(figures.upd).toBe(0)
    expect(per(figures.answers)).toBeLessThanOrEqual(NEW_FORM_ANSWER_BYTES)
  } else {
    expect(figures.upd).toBeGreaterThanOrEqual(PAYMENTS)
    expect(figures.hot / figures.upd).toBeGreaterThanOrEqual(0.99)
  }
  expect(figures.perKey).toBeLessThanOrEqual(2200)
  expect(per(figures.processing)).toBeLessThanOrEqual(apart ? NEW_FORM_LIST_BYTES : 330)
  // The completed rows carry no summary (sql/engine/00017: the fillfactor counts on it).
  const [kept] = await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'done' and summary is not null`
  expect(kept?.n).toBe(0)
}, 120_000)

// Catches: a completion that keeps the summary (its completed row 71 B longer, which the fillfactor of sql/engine/00017
// has no room for), by either form; or a release that drops it (an operator then cannot tell what a released request was).
test('a completion clears the route\'s summary, by the statement and by the transactional form; a release keeps it', async () => {
  const summary = { customer: 'cus_summary', amount: 4200, currency: 'EUR' }
  // Pools of its own: the test before closed the database's to read the backends' counters.
  const pools = openPools(db.url)
  const claimed = async () => {
    const result = await claim(pools.short, identity(), { ttlSeconds: 30, retentionSeconds: 3600, summary })
    if (result.kind !== 'created') throw new Error(`expected a fresh claim, got ${result.kind}`)
    return result.lease
  }
  try {
    const [byStatement, byTransaction, released] = [await claimed(), await claimed(), await claimed()]
    const summaryOf = async (key: string) => (await db.sql<{ summary: unknown }[]>`select summary from idempotency_key_states where key = ${key}`)[0]?.summary
    expect(await summaryOf(byStatement.key)).toEqual(summary)
    await completeRows(pools.work, byStatement, { status: 201, headers: {}, body: '{}' }, {})
    await complete(pools.work, byTransaction, async () => ({ status: 201, headers: {}, body: '{}' }))
    expect(await release(pools.short, released)).toBe(true)
    expect([await summaryOf(byStatement.key), await summaryOf(byTransaction.key), await summaryOf(released.key)]).toEqual([null, null, summary])
  } finally {
    await pools.close()
  }
})
