/**
 * Plans that do not depend on the table's size or on plan caching: every
 * statement on the request path (claims, batched or alone, completions of
 * both forms, releases, the three take-overs, replays, the payment reads)
 * reaches idempotency_keys, idempotency_processing and idempotency_answers
 * (the new form's; the old form's run, TEST_KEY_FORM=old, has none) through their indexes,
 * by a condition, even when its plan is generic and was made while the
 * tables were empty and never analyzed. That is where every deployment
 * starts: a plan cached then is kept while the table grows, and a hash
 * anti-join over a sequential scan made every claim read the whole table
 * (issue 25: 5,153 scans reading 20.7 M rows for 8,494 payments).
 *
 * The plans are the ones PostgreSQL executed (test/support/plans.ts), for
 * the statements the service and the engine really send.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { completeRows } from '../../src/core/complete-rows'
import { fingerprint } from '../../src/core/fingerprint'
import { release } from '../../src/core/release'
import type { Lease, RequestIdentity } from '../../src/core/types'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { firstLooks, KEY_TABLES } from '../support/autovacuum'
import { capturePlans, type PlanCapture } from '../support/plans'

const TABLES = KEY_TABLES
/** Keys of the new form (sql/engine/00020): the answers are read and written beside the keys. */
const apart = process.env.TEST_KEY_FORM !== 'old'

let db: TestDatabase
let capture: PlanCapture
let app: InProcessService
beforeAll(async () => {
  db = await createTestDatabase('request_path_plans')
  // Never analyzed, and kept so for the whole file: autovacuum would give the planner real statistics.
  for (const table of [...TABLES, 'payments']) await db.sql.unsafe(`alter table ${table} set (autovacuum_enabled = false)`)
  capture = capturePlans(db.url)
  app = await startApp({ ...db, pools: capture.pools })
})
afterAll(async () => {
  await app?.stop()
  await capture?.pools.close()
  await db?.drop()
})

const HEADERS = { authorization: 'Bearer acme-key', 'content-type': 'application/json' }
const post = (key: string, body: object) => app.fetch('/api/payments', { method: 'POST', headers: { ...HEADERS, 'idempotency-key': key }, body: JSON.stringify(body) })
const body = (n: number) => ({ amount: 100 + n, currency: 'EUR', customer: `cus_plans_${n}` })

function identity(key: string): RequestIdentity {
  return { tenant: 'acme', key, method: 'POST', path: '/engine', fingerprint: fingerprint('POST', '/engine', { key }) }
}
const timing = { ttlSeconds: 30, retentionSeconds: 86_400 }
const answer = { status: 201, headers: { 'content-type': 'application/json' }, body: '{}' }
async function claimed(key: string, now?: Date): Promise<Lease> {
  const result = await claim(capture.pools.short, identity(key), { ...timing, now })
  if (result.kind !== 'created' && result.kind !== 'reclaimed') throw new Error(`${key}: ${result.kind}`)
  return result.lease
}

/** Every kind of statement of the request path, once: keys named after `run`. */
async function requestPath(run: string): Promise<void> {
  // The service: a payment alone, then 24 at once (batched claims and completions), a replay,
  // a mismatch, the reads.
  const first = await post(`${run}-first`, body(0))
  expect(first.status).toBe(201)
  const { id } = (await first.json()) as { id: string }
  const burst = await Promise.all(Array.from({ length: 24 }, (_, n) => post(`${run}-burst-${n}`, body(n + 1))))
  expect(burst.map((response) => response.status)).toEqual(burst.map(() => 201))
  expect((await post(`${run}-first`, body(0))).headers.get('idempotent-replayed')).toBe('true')
  expect((await post(`${run}-first`, body(99))).status).toBe(422)
  expect((await app.fetch(`/api/payments/${id}`, { headers: HEADERS })).status).toBe(200)
  expect((await app.fetch('/api/payments?customer=cus_plans_0', { headers: HEADERS })).status).toBe(200)

  // The engine's other paths: in progress, the transactional completion, a release and its retake,
  // a stale key taken over, a completed key past its retention renewed.
  const inFlight = await claimed(`${run}-in-flight`)
  expect((await claim(capture.pools.short, identity(`${run}-in-flight`), timing)).kind).toBe('in_progress')
  await complete(capture.pools.work, inFlight, async () => answer)
  const released = await claimed(`${run}-released`)
  expect(await release(capture.pools.short, released, 'failed')).toBe(true)
  expect((await claim(capture.pools.short, identity(`${run}-released`), timing)).kind).toBe('created')
  await claimed(`${run}-stale`, new Date(Date.now() - 60_000))
  expect((await claim(capture.pools.short, identity(`${run}-stale`), timing)).kind).toBe('reclaimed')
  const old = new Date(Date.now() - 2 * 86_400_000)
  await completeRows(capture.pools.short, await claimed(`${run}-expired`, old), answer, {}, { now: old })
  expect((await claim(capture.pools.short, identity(`${run}-expired`), timing)).kind).toBe('created')

  // A claim and a completion queued behind a statement in flight: one statement carries both (core/lane.ts).
  const finishing = await claimed(`${run}-finishing`)
  const [alone, beside, completed] = await Promise.all([
    claim(capture.pools.short, identity(`${run}-alone`), timing),
    claim(capture.pools.short, identity(`${run}-beside`), timing),
    completeRows(capture.pools.short, finishing, answer, {}),
  ])
  expect([alone.kind, beside.kind, completed.status]).toEqual(['created', 'created', 201])
}

/** The accesses to the key tables seen since the last call, printed; fails on any that is not an index probe. */
function expectOnlyProbes(): void {
  const accesses = capture.accesses(TABLES)
  const summary = [...new Set(accesses.map((a) => `${a.table}: ${a.node}${a.index ? ` ${a.index}` : ''}${a.probed ? '' : ' (whole)'} <- ${a.query.slice(0, 70)}`))]
  console.log(`${capture.statements()} plans, ${accesses.length} accesses to the key tables:\n${summary.join('\n')}`)
  capture.clear()
  // Each kind of statement was seen: the claim, its insert into the list, the completion's delete from it,
  // and a statement carrying claims and completions together.
  expect(accesses.some((a) => a.table === 'idempotency_processing')).toBe(true)
  if (apart) expect(accesses.some((a) => a.table === 'idempotency_answers')).toBe(true)
  expect(accesses.some((a) => a.query.includes('idempotent-post: claim and complete'))).toBe(true)
  expect(accesses.filter((a) => !a.probed || a.index === undefined)).toEqual([])
}

test('every statement of the request path reaches the key tables by their indexes under generic plans on empty, never-analyzed tables', async () => {
  const [never] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from pg_stat_user_tables
     where relname in ${db.sql(TABLES)} and coalesce(last_analyze, last_autoanalyze, last_vacuum, last_autovacuum) is null`
  expect(never!.n).toBe(TABLES.length)
  await requestPath('empty')
  expectOnlyProbes()
})

test('and with the statistics of their first autovacuum, which the tables put past the crossover (sql/engine/00006, 00018)', async () => {
  // The least a table has been through when autovacuum first looks at it: its thresholds (with the defaults the
  // list's was 50 entries, a page or four).
  const looks = await firstLooks(db.sql, apart)
  const answerBody = `'{"id":"' || gen_random_uuid() || '","amount":1000,"currency":"EUR","customer":"cus_' || g || '","status":"succeeded"}'`
  // Keys as a payment leaves them: of the old form, the answer on the row; of the new, the answer apart (as many of
  // them as its own first look counts); and the list's rows come and gone.
  if (apart) {
    await db.sql.unsafe(`
      with keys as (
        insert into idempotency_keys (tenant, key, method, path, digest, locked_at)
        select 'acme', 'seed-' || g, 'POST', '/api/payments', sha256(g::text::bytea), null from generate_series(1, ${looks.idempotency_keys}) g
        returning request_id, key
      )
      insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
      select 'acme', request_id, now(), 201, '{}', ${answerBody.replaceAll("|| g ||", "|| substr(key, 6) ||")}
        from keys order by key limit ${looks.idempotency_answers}`)
  } else {
    await db.sql.unsafe(`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, completed_at, response_status, response_headers, response_body)
      select 'acme', 'seed-' || g, 'POST', '/api/payments', encode(sha256(g::text::bytea), 'hex'), 'done', now(), 201,
             '{"content-type":"application/json"}', ${answerBody}
        from generate_series(1, ${looks.idempotency_keys}) g`)
  }
  await db.sql`insert into idempotency_processing select now() + make_interval(secs => g), 'acme', 'gone-' || g, now() from generate_series(1, ${looks.idempotency_processing}) g`
  await db.sql`delete from idempotency_processing where key like 'gone-%'`
  // Autovacuum never looks at a table nothing changed: in the old form the answers are empty and never analyzed.
  const looked = apart ? TABLES : TABLES.filter((table) => table !== 'idempotency_answers')
  await db.sql.unsafe(`vacuum analyze ${looked.join(', ')}`)
  const pages = await db.sql<{ relname: string; relpages: number }[]>`
    select relname, relpages from pg_class where relname in ${db.sql(TABLES)} order by relname`
  console.log(`at the first autovacuum: ${pages.map((row) => `${row.relname} ${row.relpages} pages`).join(', ')}`)
  // The statistics changed: PostgreSQL plans every statement again, on them.
  await requestPath('vacuumed')
  expectOnlyProbes()
})
