/**
 * The take-overs of src/core/reclaim.ts (reclaim of a stale key, retake of a
 * released one, renewal of an expired one) under a barrier instead of luck.
 *
 * A session of the test holds the key's row lock (FOR UPDATE), as a
 * completion between its fence and its COMMIT does (in the new form, its
 * processing entry's), while two retries try to take the key over. Each take-over locks the row it read with FOR UPDATE
 * NOWAIT, so both are answered at once (in progress) while the lock is held.
 * Without the lock clause, both read the row, both UPDATEs queue behind the
 * holder, and once it lets go both succeed: two leases for one key, two
 * workers running one request. Without NOWAIT they queue (a retry that waits
 * on a worker). Either way the barrier makes it happen every run, where 40
 * concurrent retries without one caught it 4 runs in 5.
 *
 * The retries run on a pool without lock_timeout, so a queued UPDATE waits
 * for the barrier instead of giving up after the service's 1 s.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { claim } from '../../src/core/claim'
import type { ClaimResult, RequestIdentity } from '../../src/core/types'
import { createTestDatabase, lockCompletionTarget, type TestDatabase } from '../support/db'
import { createKey, identity, secondsAfter } from '../support/keys'
import { track, waitFor } from '../support/wait'
import { KEY_STATES } from '../../src/core/key-states'

const TTL = 30
const RETENTION = 3600
const RACERS = 2
const APPLICATION = `reclaim-race-${crypto.randomUUID().slice(0, 8)}`

let db: TestDatabase
let racers: postgres.Sql<Record<string, never>>
beforeAll(async () => {
  db = await createTestDatabase('reclaim_race')
  racers = postgres(db.url, { max: RACERS, connection: { application_name: APPLICATION }, onnotice: () => undefined }) as postgres.Sql<Record<string, never>>
})
afterAll(async () => {
  await racers?.end({ timeout: 1 })
  await db?.drop()
})

/** Retries' sessions queued on a lock right now. */
async function queuedOnLock(): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from pg_stat_activity
     where datname = current_database() and application_name = ${APPLICATION} and wait_event_type = 'Lock'`
  return row!.n
}

async function keyRow(id: RequestIdentity) {
  const [row] = await db.sql<{ status: string; lease: string; attempts: number }[]>`
    select k.status, k.lease::text, k.attempts from ${db.sql.unsafe(KEY_STATES)} k where k.tenant = ${id.tenant} and k.key = ${id.key}`
  return row!
}

/**
 * What the test's session holds: what a completion holds between its fence and
 * its commit (the key's row in the old form, its processing entry in the new:
 * lockCompletionTarget), or the key's row whatever the form (an operator's
 * SELECT ... FOR UPDATE; in the old form the same).
 */
type Hold = 'completion' | 'row'

/**
 * RACERS retries of `id` at `now` while a session holds `hold`;
 * then, once it let go, RACERS more at once. Returns what each saw.
 */
async function race(id: RequestIdentity, now: Date, hold: Hold = 'completion') {
  const timing = { ttlSeconds: TTL, retentionSeconds: RETENTION, now }
  const holder = await db.sql.reserve()
  let during: ReturnType<typeof track<ClaimResult>>[]
  let answeredWhileLocked: boolean
  try {
    await holder`begin`
    if (hold === 'completion') await lockCompletionTarget(holder, id.key, id.tenant)
    else await holder`select 1 from idempotency_keys where tenant = ${id.tenant} and key = ${id.key} for update`
    during = Array.from({ length: RACERS }, () => track(claim(racers, id, timing)))
    // The barrier: every retry has either answered, or is queued behind the holder.
    await waitFor(async () => during.every((t) => t.settled()) || (await queuedOnLock()) + during.filter((t) => t.settled()).length === RACERS,
      'every retry answered or queued on the row lock')
    answeredWhileLocked = during.every((t) => t.settled())
  } finally {
    await holder`rollback`
    holder.release()
  }
  const whileLocked = await Promise.all(during.map((t) => t.promise))
  const after = await Promise.all(Array.from({ length: RACERS }, () => claim(racers, id, timing)))
  return { answeredWhileLocked, whileLocked: whileLocked.map((r) => r.kind), after: after.map((r) => r.kind) }
}

const takeOvers = (kinds: string[]) => kinds.filter((k) => k === 'created' || k === 'reclaimed').length

describe('take-overs never wait on a row lock, and exactly one retry takes a key over', () => {
  // What a completion holds (the row in the old form, the entry in the new), and in the new form the row alone
  // (an operator's SELECT ... FOR UPDATE), which the reclaim updates too.
  test.each([['completion'], ['row']] as const)('reclaim of a stale processing key (its worker died), holding %s', async (hold) => {
    const id = identity()
    const lockedAt = new Date()
    await createKey(db.sql, id, { status: 'processing', lockedAt })
    const before = await keyRow(id)
    const seen = await race(id, secondsAfter(lockedAt, TTL + 1), hold)
    expect(takeOvers([...seen.whileLocked, ...seen.after])).toBe(1)
    expect(seen.answeredWhileLocked).toBe(true)
    expect(seen.whileLocked).toEqual(Array(RACERS).fill('in_progress'))
    const row = await keyRow(id)
    expect(row.attempts).toBe(before.attempts + 1) // one take-over, not two
    expect(row.lease).not.toBe(before.lease)
  })

  test('retake of a released key (its last execution failed)', async () => {
    const id = identity()
    await createKey(db.sql, id, { status: 'processing' })
    await db.sql`update idempotency_keys set status = 'released', released_at = now(), owner = null where tenant = ${id.tenant} and key = ${id.key}`
    await db.sql`delete from idempotency_processing where tenant = ${id.tenant} and key = ${id.key} and lease is not null` // the new form's entry
    const before = await keyRow(id)
    const seen = await race(id, new Date(), 'row')
    expect(takeOvers([...seen.whileLocked, ...seen.after])).toBe(1)
    expect(seen.answeredWhileLocked).toBe(true)
    expect(seen.whileLocked).toEqual(Array(RACERS).fill('in_progress'))
    const row = await keyRow(id)
    expect(row).toMatchObject({ status: 'processing', attempts: before.attempts + 1 })
  })

  test('renewal of a completed key past its retention (a new request under it)', async () => {
    const id = identity()
    const completedAt = new Date()
    await createKey(db.sql, id, { status: 'done', completedAt })
    const before = await keyRow(id)
    const seen = await race(id, secondsAfter(completedAt, RETENTION + 1), 'row')
    expect(takeOvers([...seen.whileLocked, ...seen.after])).toBe(1)
    expect(seen.answeredWhileLocked).toBe(true)
    expect(seen.whileLocked).toEqual(Array(RACERS).fill('in_progress'))
    const row = await keyRow(id)
    expect(row).toMatchObject({ status: 'processing', attempts: 1 })
    expect(row.lease).not.toBe(before.lease)
  })
})
