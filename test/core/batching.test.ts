/**
 * Batched claims and declarative completions (core/batcher.ts): many
 * requests share a statement, and each still gets its own outcome. A
 * member's lost lease or bad row fails that member only; a connection lost
 * under a batch fails every member it carried and leaves each key in
 * processing, to be released or reclaimed, never half-written.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { claim, claimStats } from '../../src/core/claim'
import { claimBatchSql } from '../../src/core/claim-sql'
import { newLeaseId } from '../../src/core/lease-id'
import { completeRows, completionStats } from '../../src/core/complete-rows'
import { laneOf } from '../../src/core/lane'
import { DatabaseUnavailableError, isLockFailure, isUnavailable, LeaseLostError } from '../../src/core/errors'
import { reclaim } from '../../src/core/reclaim'
import type { Lease, StoredResponse } from '../../src/core/types'
import type { RowWrites } from '../../src/core/completion-sql'
import { newPayment } from '../../src/payments/insert-payment'
import { openPools, type Pools } from '../../src/store/db'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { identity, secondsAfter } from '../support/keys'
import { lockTable, type TableLock } from '../support/table-lock'
import { waitFor } from '../support/wait'
import { KEY_STATES } from '../../src/core/key-states'

const timing = { ttlSeconds: 30, retentionSeconds: 3600 }

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('batching') })
afterAll(async () => { await db?.drop() })

async function claimed(tenant = 'acme'): Promise<Lease> {
  const result = await claim(db.pools.short, identity({ tenant }), timing)
  if (result.kind !== 'created') throw new Error(`unexpected claim: ${result.kind}`)
  return result.lease
}

function paymentFor(lease: Lease, overrides: { currency?: string } = {}) {
  const payment = newPayment(lease.tenant, { amount: 100, currency: overrides.currency ?? 'EUR', customer: 'cus_b' }, `ch_${lease.lease}`, lease.key)
  const response = { status: 201, headers: { 'content-type': 'application/json' }, body: JSON.stringify(payment.json) }
  return { response, insert: { payments: [payment.row] } }
}

const complete = (pools: Pools, lease: Lease, overrides: { currency?: string } = {}) => {
  const { response, insert } = paymentFor(lease, overrides)
  return completeRows(pools.work, lease, response, insert)
}

const payments = async (keys: readonly string[]) =>
  (await db.sql<{ n: number }[]>`select count(*)::int as n from payments where idempotency_key in ${db.sql(keys as string[])}`)[0]!.n
const statusOf = async (key: string) => (await db.sql<{ status: string }[]>`select k.status from ${db.sql.unsafe(KEY_STATES)} k where k.key = ${key}`)[0]!.status
const listed = async (keys: readonly string[]) =>
  (await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_processing where key in ${db.sql(keys as string[])}`)[0]!.n

describe('claims', () => {
  // Catches: one statement per claim (no batching), or a batch that hands rows to the wrong member.
  test('64 concurrent claims of distinct keys share statements, and each gets its own key', async () => {
    const before = claimStats(db.pools.short)
    const ids = Array.from({ length: 64 }, () => identity())
    const results = await Promise.all(ids.map((id) => claim(db.pools.short, id, timing)))
    const after = claimStats(db.pools.short)
    expect(results.every((result) => result.kind === 'created')).toBe(true)
    expect(results.map((result) => (result.kind === 'created' ? result.lease.key : ''))).toEqual(ids.map((id) => id.key))
    expect(after.members - before.members).toBe(64)
    expect(after.statements - before.statements).toBeLessThan(64)
    expect(await listed(ids.map((id) => id.key))).toBe(64)
  })

  // Catches: a batch inserting one key twice, or members of one key all told they created it.
  test('the same key many times in one batch: one claim, the same request is in progress, another body a mismatch', async () => {
    const id = identity()
    const other = { ...id, fingerprint: identity({ body: { amount: 2 } }).fingerprint }
    const results = await Promise.all([
      ...Array.from({ length: 20 }, () => claim(db.pools.short, id, timing)),
      ...Array.from({ length: 5 }, () => claim(db.pools.short, other, timing)),
    ])
    const kinds = results.map((result) => result.kind)
    expect(kinds.filter((kind) => kind === 'created')).toHaveLength(1)
    const created = results.findIndex((result) => result.kind === 'created')
    const sameAsWinner = created < 20 ? kinds.slice(0, 20) : kinds.slice(20)
    expect(sameAsWinner.filter((kind) => kind === 'in_progress')).toHaveLength(sameAsWinner.length - 1)
    expect((created < 20 ? kinds.slice(20) : kinds.slice(0, 20)).every((kind) => kind === 'mismatch')).toBe(true)
  })

  // Catches: a winner left to the sort (the INSERT orders by key only): two requests of one key with other
  // bodies, in one batch, are decided in the order they reached the process, as they would be one by one.
  // Through a lane that never sends a statement beside another: one sent beside the first (past 20 ms, a new
  // connection on a busy machine) may reach the database before it, and then the second won (seen once, beside a
  // CI run): the order the process keeps is its statements', not its connections'.
  test('two requests of one key with other bodies: the first to arrive wins, the other is a mismatch, in either order', async () => {
    const ordered = openPools(db.url, { applicationName: 'lane-order', shortMax: 2 })
    laneOf(ordered.short, { overlapAfterMs: 60_000, overlapAtDepth: Number.POSITIVE_INFINITY })
    try {
      for (let round = 0; round < 20; round++) {
        const first = identity({ body: { amount: round } })
        const second = { ...first, fingerprint: identity({ body: { amount: 1_000 + round } }).fingerprint }
        const [a, b] = round % 2 === 0 ? [first, second] : [second, first]
        const results = await Promise.all([claim(ordered.short, a, timing), claim(ordered.short, b, timing)])
        expect(results.map((result) => result.kind)).toEqual(['created', 'mismatch'])
      }
      // Within one statement too: twelve bodies of one key queued behind a statement in flight share the next one.
      for (let round = 0; round < 10; round++) {
        const key = identity()
        const bodies = Array.from({ length: 12 }, (_, i) => ({ ...key, fingerprint: identity({ body: { amount: i + 1 } }).fingerprint }))
        const before = claimStats(ordered.short)
        const busy = claim(ordered.short, identity(), timing)
        const results = await Promise.all(bodies.map((body) => claim(ordered.short, body, timing)))
        await busy
        expect(claimStats(ordered.short).statements - before.statements).toBeLessThanOrEqual(2)
        expect(results.map((result) => result.kind)).toEqual(['created', ...Array(11).fill('mismatch')])
      }
    } finally {
      await ordered.close(1)
    }
  })
})

describe('claims', () => {
  // Catches: a batch inserting in its members' order: two batches sharing keys in opposite orders deadlock
  // (each waits on the other's uncommitted insert), which lock_timeout ends as a failed claim (a 503).
  test('two batches in flight with the same keys in opposite orders both finish, one claim per key', async () => {
    const slow = await createTestDatabase('batch_order')
    const pools = [openPools(slow.url, { applicationName: 'order-a', shortMax: 1 }), openPools(slow.url, { applicationName: 'order-b', shortMax: 1 })]
    try {
      // Each insert of a key takes 0.3 s, so the two statements interleave: A has k1 when B has k2.
      await slow.sql.unsafe(`
        create function test_slow_insert() returns trigger language plpgsql as $$ begin perform pg_sleep(0.3); return new; end $$;
        create trigger test_slow_insert before insert on idempotency_keys for each row execute function test_slow_insert();`)
      const member = (key: string, n: number) => ({
        n, tenant: 'acme', key, method: 'POST', path: '/api/payments', fingerprint: 'a'.repeat(64),
        lease: newLeaseId(), owner: null, now: null, ttl: 30, summary: null,
      })
      const keys = ['k1', 'k2', 'k3']
      const batch = (order: string[]) => order.map((key, n) => member(key, n))
      const [a, b] = await Promise.all([
        pools[0]!.short.unsafe<{ n: number; fresh: boolean }[]>(claimBatchSql, [JSON.stringify(batch(keys))]),
        pools[1]!.short.unsafe<{ n: number; fresh: boolean }[]>(claimBatchSql, [JSON.stringify(batch([...keys].reverse()))]),
      ])
      expect(a.length + b.length).toBeLessThanOrEqual(6)
      expect(a.filter((row) => row.fresh).length + b.filter((row) => row.fresh).length).toBe(3)
      expect((await slow.sql<{ n: number }[]>`select count(*)::int as n from idempotency_keys`)[0]!.n).toBe(3)
    } finally {
      for (const pool of pools) await pool.close(1)
      await slow.drop()
    }
  }, 20_000)
})

describe('declarative completions', () => {
  // Catches: a batch that commits a fenced-off member's rows, or fails all members for one lost lease.
  test('a batch in which one lease was lost commits the others and fails only that one', async () => {
    const leases = await Promise.all(Array.from({ length: 12 }, () => claimed()))
    const lost = leases[5]!
    // A retry took key 5 over (its worker stopped at the deadline): the old lease is fenced.
    const taken = await reclaim(db.pools.short, lost, { ...timing, now: secondsAfter(new Date(), 31) })
    expect(taken).not.toBeNull()
    const before = completionStats(db.pools.work)
    const outcomes = await Promise.allSettled(leases.map((lease) => complete(db.pools, lease)))
    expect(completionStats(db.pools.work).statements - before.statements).toBeLessThan(leases.length)
    outcomes.forEach((outcome, i) => {
      if (i === 5) expect(outcome.status === 'rejected' && outcome.reason instanceof LeaseLostError).toBe(true)
      else expect(outcome.status).toBe('fulfilled')
    })
    expect(await payments(leases.map((lease) => lease.key))).toBe(11)
    expect(await payments([lost.key])).toBe(0)
    expect(await statusOf(lost.key)).toBe('processing') // the new owner's
    expect(await listed(leases.map((lease) => lease.key))).toBe(1) // only the new owner's entry is left
  })

  // Catches: a batch failing every member for one member's bad row (no member-by-member retry).
  test('a member whose row breaks a CHECK fails alone; the others commit', async () => {
    const leases = await Promise.all(Array.from({ length: 8 }, () => claimed()))
    const outcomes = await Promise.allSettled(leases.map((lease, i) => complete(db.pools, lease, i === 3 ? { currency: 'eur' } : {})))
    expect(outcomes.map((outcome) => outcome.status)).toEqual(leases.map((_, i) => (i === 3 ? 'rejected' : 'fulfilled')))
    expect(await payments(leases.map((lease) => lease.key))).toBe(7)
    expect(await statusOf(leases[3]!.key)).toBe('processing') // nothing half-written: the caller releases it
  })

  // Catches: a lost connection answered as a lease loss (the request would say 409 and keep the key), or rows without their key.
  test('a batch cut by a terminated connection fails every member as unavailable and writes nothing', async () => {
    const pools = openPools(db.url, { applicationName: 'batch-cut', shortMax: 2, workMax: 1 })
    let blocker: TableLock | undefined
    try {
      const leases = await Promise.all(Array.from({ length: 6 }, () => claimed()))
      blocker = await lockTable(db.sql, 'payments')
      const outcomes = Promise.allSettled(leases.map((lease) => complete(pools, lease)))
      await waitFor(async () => (await db.sql`
        select 1 from pg_stat_activity where datname = current_database() and application_name = 'batch-cut:work' and wait_event_type = 'Lock'`).length > 0,
      'the completing statement to wait on the lock')
      const [{ n }] = await db.sql<{ n: number }[]>`
        select count(pg_terminate_backend(pid))::int as n from pg_stat_activity
         where datname = current_database() and application_name = 'batch-cut:work'` as unknown as [{ n: number }]
      expect(n).toBe(1)
      await blocker.release()
      // The statement on the killed connection fails every member it carried;
      // a later batch, on a new connection, may commit. Nothing is half-written either way.
      const settled = await outcomes
      expect(settled.filter((outcome) => outcome.status === 'rejected').length).toBeGreaterThan(0)
      for (const [i, outcome] of settled.entries()) {
        const lease = leases[i]!
        if (outcome.status === 'rejected') {
          expect(outcome.reason).toBeInstanceOf(DatabaseUnavailableError)
          expect({ status: await statusOf(lease.key), payments: await payments([lease.key]), listed: await listed([lease.key]) }).toEqual({ status: 'processing', payments: 0, listed: 1 })
        } else {
          expect({ status: await statusOf(lease.key), payments: await payments([lease.key]), listed: await listed([lease.key]) }).toEqual({ status: 'done', payments: 1, listed: 0 })
        }
      }
      // And the pool is usable again at once.
      const again = await claimed()
      await complete(pools, again)
      expect(await payments([again.key])).toBe(1)
    } finally {
      await blocker?.release()
      await pools.close(1)
    }
  })
})

describe('claims and completions in one statement (core/lane.ts)', () => {
  // The tests that need one shared statement send through a lane that never overlaps: a first statement slower
  // than the default 20 ms (a new connection on a busy machine), or more members queued behind it than the lane's
  // overlapAtDepth, would otherwise let the queue go beside it split by kind, and the statement under test would
  // never be made.
  const NEVER_BESIDE = { overlapAfterMs: 60_000, overlapAtDepth: Number.POSITIVE_INFINITY }
  let shared: Pools
  beforeAll(() => {
    shared = openPools(db.url, { applicationName: 'lane-shared', shortMax: 2 })
    laneOf(shared.short, NEVER_BESIDE)
  })
  afterAll(async () => { await shared?.close(1) })

  const completeBeside = (lease: Lease, overrides: { currency?: string } = {}) => {
    const { response, insert } = paymentFor(lease, overrides)
    return completeRows(shared.short, lease, response, insert)
  }

  // Catches: rows handed to the wrong kind or member (a claim told it completed, a completion fenced for a claim's row),
  // a fenced-off completion's rows written, or a retry beside its own completion inserting the key again.
  test('queued together they share a statement, and each claim and each completion gets its own outcome', async () => {
    const leases = await Promise.all(Array.from({ length: 10 }, () => claimed()))
    const lost = leases[4]!
    expect(await reclaim(db.pools.short, lost, { ...timing, now: secondsAfter(new Date(), 31) })).not.toBeNull()
    const retried = identity()
    const retriedLease = (await claim(db.pools.short, retried, timing)) as { kind: 'created'; lease: Lease }
    const fresh = Array.from({ length: 10 }, () => identity())
    const lane = laneOf(shared.short)
    const sharedBefore = lane.sharedStatements
    // The first claim goes alone; everything else queues behind it and goes out together.
    const busy = claim(shared.short, identity(), timing)
    const [claims, retry, completions, retriedCompletion] = await Promise.all([
      Promise.all(fresh.map((id) => claim(shared.short, id, timing))),
      claim(shared.short, retried, timing),
      Promise.allSettled(leases.map((lease) => completeBeside(lease))),
      completeBeside(retriedLease.lease),
    ])
    expect((await busy).kind).toBe('created')
    expect(lane.sharedStatements - sharedBefore).toBe(1)
    expect(claims.map((result) => (result.kind === 'created' ? result.lease.key : result.kind))).toEqual(fresh.map((id) => id.key))
    expect(retry.kind).toBe('in_progress') // its own request is completing in the same statement
    expect(retriedCompletion.status).toBe(201)
    completions.forEach((outcome, i) => {
      if (i === 4) expect(outcome.status === 'rejected' && outcome.reason instanceof LeaseLostError).toBe(true)
      else expect(outcome.status).toBe('fulfilled')
    })
    expect(await payments(leases.map((lease) => lease.key))).toBe(9)
    expect(await payments([lost.key, retried.key])).toBe(1)
    expect(await statusOf(lost.key)).toBe('processing') // the new owner's
    expect(await listed(fresh.map((id) => id.key))).toBe(10)
    expect(await listed([...leases.map((lease) => lease.key), retried.key])).toBe(1) // only the new owner's entry of the lost key
  })

  // Catches: a shared statement failing its claims for a completion's bad row (no member-by-member retry).
  test('a completion whose row breaks a CHECK fails alone; the claims and completions beside it commit', async () => {
    const leases = await Promise.all(Array.from({ length: 6 }, () => claimed()))
    const fresh = Array.from({ length: 6 }, () => identity())
    const busy = claim(shared.short, identity(), timing)
    const [claims, completions] = await Promise.all([
      Promise.all(fresh.map((id) => claim(shared.short, id, timing))),
      Promise.allSettled(leases.map((lease, i) => completeBeside(lease, i === 2 ? { currency: 'eur' } : {}))),
    ])
    await busy
    expect(claims.map((result) => result.kind)).toEqual(fresh.map(() => 'created'))
    expect(completions.map((outcome) => outcome.status)).toEqual(leases.map((_, i) => (i === 2 ? 'rejected' : 'fulfilled')))
    expect(await payments(leases.map((lease) => lease.key))).toBe(5)
    expect(await statusOf(leases[2]!.key)).toBe('processing')
  })

  // Catches: a statement of many members that waits on one member's locked row for the session's lock_timeout and
  // fails every member (no short wait, or no member-by-member retry after a lock failure).
  test('a member whose key\'s row another session holds fails alone; the claims and completions beside it are answered while the row is still locked', async () => {
    const leases = await Promise.all(Array.from({ length: 4 }, () => claimed()))
    const stuck = identity()
    const foreign = await db.sql.reserve()
    try {
      await foreign`begin`
      // Another session's uncommitted insert of the key: our insert of it must wait for that transaction.
      await foreign.unsafe(claimBatchSql, [JSON.stringify([{
        n: 0, tenant: stuck.tenant, key: stuck.key, method: stuck.method, path: stuck.path, fingerprint: stuck.fingerprint,
        lease: newLeaseId(), owner: null, now: null, ttl: 30, summary: null, http_request_id: null,
      }])])
      const fresh = Array.from({ length: 5 }, () => identity())
      const busy = claim(shared.short, identity(), timing)
      const stuckClaim = claim(shared.short, stuck, timing).then(() => 'answered', (error: unknown) => error)
      const [claims, completions] = await Promise.all([
        Promise.all(fresh.map((id) => claim(shared.short, id, timing))),
        Promise.allSettled(leases.map((lease) => completeBeside(lease))),
      ])
      await busy
      expect(claims.map((result) => result.kind)).toEqual(fresh.map(() => 'created'))
      expect(completions.map((outcome) => outcome.status)).toEqual(leases.map(() => 'fulfilled'))
      expect(await foreign`select 1`).toHaveLength(1) // still in its transaction: nothing above waited for it
      expect(isLockFailure(await stuckClaim)).toBe(true) // the engine's answer; the plugin sends it again (key-lock-isolation.test.ts)
      expect(await payments(leases.map((lease) => lease.key))).toBe(4)
    } finally {
      await foreign`rollback`.catch(() => {})
      foreign.release()
    }
  })

  // Catches: a shared statement cut mid-query answered as anything but unavailable (a claim told it lost,
  // a completion told its lease was lost), or half of it written (the claims' keys without the completions').
  test('a shared statement whose backend is terminated mid-query fails its claims and completions as unavailable and writes nothing', async () => {
    const pools = openPools(db.url, { applicationName: 'lane-cut', shortMax: 2 })
    laneOf(pools.short, NEVER_BESIDE)
    let blocker: TableLock | undefined
    try {
      const leases = await Promise.all(Array.from({ length: 3 }, () => claimed()))
      blocker = await lockTable(db.sql, 'payments')
      // The first claim goes alone; the claims and completions behind it share the next statement, which waits on the lock.
      const busy = claim(pools.short, identity(), timing)
      const ids = Array.from({ length: 3 }, () => identity())
      const claims = Promise.allSettled(ids.map((id) => claim(pools.short, id, timing)))
      const completions = Promise.allSettled(leases.map((lease) => {
        const { response, insert } = paymentFor(lease)
        return completeRows(pools.short, lease, response, insert)
      }))
      expect((await busy).kind).toBe('created')
      let pid = 0
      await waitFor(async () => {
        const rows = await db.sql<{ pid: number }[]>`
          select pid from pg_stat_activity where datname = current_database() and application_name = 'lane-cut:short'
             and wait_event_type = 'Lock' and query like '%idempotent-post: claim and complete%'`
        pid = rows[0]?.pid ?? 0
        return pid !== 0
      }, 'the shared statement to wait on the lock')
      await db.sql`select pg_terminate_backend(${pid})`
      await blocker.release()
      const [claimed_, completed] = await Promise.all([claims, completions])
      for (const outcome of claimed_) expect(outcome.status === 'rejected' && isUnavailable(outcome.reason)).toBe(true)
      for (const outcome of completed) expect(outcome.status === 'rejected' && outcome.reason instanceof DatabaseUnavailableError).toBe(true)
      const keysOf = await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_keys where key in ${db.sql(ids.map((id) => id.key))}`
      expect({ claimedKeys: keysOf[0]!.n, payments: await payments(leases.map((lease) => lease.key)), listed: await listed(leases.map((lease) => lease.key)) })
        .toEqual({ claimedKeys: 0, payments: 0, listed: 3 })
      for (const lease of leases) expect(await statusOf(lease.key)).toBe('processing')
      // And the lane goes on, on a new connection.
      const again = await claim(pools.short, identity(), timing)
      expect(again.kind).toBe('created')
    } finally {
      await blocker?.release()
      await pools.close(1)
    }
  })

  // Catches: a statement sent beside a stuck one carrying both kinds: claims queued behind completions
  // that wait on a lock would wait with them (until lock_timeout, as 503s), where they never touch the lock.
  test('completions stuck on a lock do not hold back the claims queued behind them', async () => {
    const pools = openPools(db.url, { applicationName: 'lane-stuck', shortMax: 4 })
    let blocker: TableLock | undefined
    try {
      const leases = await Promise.all(Array.from({ length: 4 }, () => claimed()))
      blocker = await lockTable(db.sql, 'payments')
      const first = Promise.allSettled(leases.slice(0, 2).map((lease) => {
        const { response, insert } = paymentFor(lease)
        return completeRows(pools.short, lease, response, insert)
      }))
      await waitFor(async () => (await db.sql`
        select 1 from pg_stat_activity where datname = current_database() and application_name = 'lane-stuck:short' and wait_event_type = 'Lock'`).length > 0,
      'the completion to wait on the lock')
      // Queued behind it: more completions first, then claims.
      const later = Promise.allSettled(leases.slice(2).map((lease) => {
        const { response, insert } = paymentFor(lease)
        return completeRows(pools.short, lease, response, insert)
      }))
      const ids = Array.from({ length: 4 }, () => identity())
      const claims = await Promise.all(ids.map((id) => claim(pools.short, id, timing)))
      // Answered while the lock is still held.
      expect(claims.map((result) => result.kind)).toEqual(ids.map(() => 'created'))
      expect((await db.sql`select 1 from pg_locks where locktype = 'relation' and mode = 'AccessExclusiveLock' and granted and pid = ${blocker.pid}`).length).toBe(1)
      await blocker.release()
      await Promise.all([first, later])
    } finally {
      await blocker?.release()
      await pools.close(1)
    }
  })
})

// The old form's mechanics: a completion updates the key's row (sql/engine/00020). In the new form it
// touches only the processing entry and the answer, so neither the lock nor the update below happens.
const oldForm = process.env.TEST_KEY_FORM === 'old'

describe.if(oldForm)('a deadlock with another session', () => {
  // Catches: a shared statement that meets a lock cycle (it holds A, waits for B; another session holds B, waits
  // for A) failing every member, or waiting on it past a few tens of milliseconds: C and D share its fate otherwise.
  test('the lane\'s statement holds A and waits for B while another session holds B and waits for A: the members beside them commit while the other session still holds its locks, A and B fail alone', async () => {
    const cycle = await createTestDatabase('lane_deadlock')
    const pools = openPools(cycle.url, { applicationName: 'lane-deadlock', shortMax: 4 })
    laneOf(pools.short, { overlapAfterMs: 60_000, overlapAtDepth: Number.POSITIVE_INFINITY }) // one shared statement for all four (see the lane tests above)
    const foreign = await cycle.sql.reserve()
    try {
      const leases: Lease[] = []
      for (let i = 0; i < 4; i++) {
        const result = await claim(cycle.pools.short, identity(), timing)
        if (result.kind !== 'created') throw new Error(result.kind)
        leases.push(result.lease)
      }
      const [a, b, c, d] = leases as [Lease, Lease, Lease, Lease]
      // The statement completes its members in their order: A's row is locked first, and held 0.3 s (a trigger)
      // while the other session, already holding B, asks for A.
      await cycle.sql.unsafe(`
        create function test_slow_done() returns trigger language plpgsql as $$
        begin if new.key = '${a.key}' and new.status = 'done' then perform pg_sleep(0.3); end if; return new; end $$;
        create trigger test_slow_done before update on idempotency_keys for each row execute function test_slow_done();`)
      await foreign`begin`
      await foreign`select 1 from idempotency_keys where tenant = ${b.tenant} and key = ${b.key} for update`
      const busy = claim(pools.short, identity(), timing)
      const outcomes = Promise.allSettled([a, b, c, d].map((lease) => {
        const { response, insert } = paymentFor(lease)
        return completeRows(pools.short, lease, response, insert)
      }))
      await busy
      await waitFor(async () => (await cycle.sql`
        select 1 from pg_stat_activity where datname = current_database() and application_name = 'lane-deadlock:short' and wait_event = 'PgSleep'`).length > 0,
      'the shared statement to hold A (in its trigger)')
      const askA = foreign`select 1 from idempotency_keys where tenant = ${a.tenant} and key = ${a.key} for update`.then(() => 'granted', (error: unknown) => error)
      const settled = await outcomes
      expect(settled.map((outcome) => outcome.status)).toEqual(['rejected', 'rejected', 'fulfilled', 'fulfilled'])
      for (const outcome of settled.slice(0, 2)) expect(outcome.status === 'rejected' && isLockFailure(outcome.reason)).toBe(true)
      expect(await askA).toBe('granted') // the other session got A once the statement gave it up: no one was left waiting
      const paid = async (lease: Lease) => (await cycle.sql<{ n: number }[]>`select count(*)::int as n from payments where idempotency_key = ${lease.key}`)[0]!.n
      expect({ a: await paid(a), b: await paid(b), c: await paid(c), d: await paid(d) }).toEqual({ a: 0, b: 0, c: 1, d: 1 })
    } finally {
      await foreign`rollback`.catch(() => {})
      foreign.release()
      await pools.close(1)
      await cycle.drop()
    }
  }, 30_000)
})

describe.if(oldForm)('completions are heap-only updates', () => {
  /**
   * 600 keys claimed and completed 32 at a time on a fresh database; the share of the completions that were
   * heap-only updates, and the key table's indexes. `claimed` gives each claim what the route sends with it.
   */
  async function completeOnFreshDatabase(fresh: TestDatabase, claimed: () => Parameters<typeof claim>[2], answer: (lease: Lease) => { response: StoredResponse; insert: RowWrites }) {
    const pools = openPools(fresh.url, { applicationName: 'hot', shortMax: 4, workMax: 4 })
    let next = 0
    const worker = async () => {
      while (next < 600) {
        next++
        const result = await claim(pools.short, identity(), claimed())
        if (result.kind !== 'created') throw new Error(result.kind)
        const { response, insert } = answer(result.lease)
        await completeRows(pools.short, result.lease, response, insert) // beside the claims, as the service sends them
      }
    }
    await Promise.all(Array.from({ length: 32 }, worker))
    await pools.close(1) // the backends report their counts as they exit
    let stats = { upd: 0, hot: 0 }
    await waitFor(async () => {
      const [row] = await fresh.sql<{ upd: number; hot: number }[]>`
        select n_tup_upd::int as upd, n_tup_hot_upd::int as hot from pg_stat_user_tables where relname = 'idempotency_keys'`
      stats = row!
      return stats.upd >= 600
    }, () => `the statistics to show 600 updates (${stats.upd})`)
    const [indexes] = await fresh.sql<{ names: string }[]>`
      select string_agg(indexrelname::text, ',' order by indexrelname) as names from pg_stat_user_indexes where relname = 'idempotency_keys'`
    return { hot: stats.hot / stats.upd, indexes: indexes!.names }
  }

  // Catches: an index on a column a completion changes (status, completed_at, stale_at...), or a fillfactor without room
  // for the service's rows (sql/service/00007). (test/store/key-bytes.test.ts, at 99 %, catches a completion that keeps the summary.)
  test('the payments service: at least 90 % of 600 completions are HOT, and none leaves an entry in the keys table\'s indexes', async () => {
    const fresh = await createTestDatabase('hot')
    try {
      // As the service claims: the route's summary and the HTTP request's id ride with the claim.
      const { hot, indexes } = await completeOnFreshDatabase(fresh, () => ({ ...timing, summary: { customer: 'cus_b', amount: 100, currency: 'EUR' }, httpRequestId: crypto.randomUUID() }), paymentFor)
      expect(hot).toBeGreaterThanOrEqual(0.9)
      // None of them reads a column a completion writes (status, completed_at, owner, stale_at, the answer).
      expect(indexes).toBe('idempotency_keys_created_at,idempotency_keys_pkey,idempotency_keys_released')
    } finally {
      await fresh.drop()
    }
  }, 60_000)

  // Catches: an engine fillfactor tuned to the service's rows (35 %: 88 % HOT here), which smaller claims leave no room under.
  test('an app on the engine alone (its schema, claims with neither a summary nor a request id): at least 90 % of 600 completions are HOT', async () => {
    const fresh = await createTestDatabase('hot_engine', { engineOnly: true })
    try {
      const { hot, indexes } = await completeOnFreshDatabase(fresh, () => timing, (lease) => ({ response: paymentFor(lease).response, insert: {} }))
      expect(hot).toBeGreaterThanOrEqual(0.9)
      expect(indexes).toBe('idempotency_keys_created_at,idempotency_keys_pkey,idempotency_keys_released')
    } finally {
      await fresh.drop()
    }
  }, 60_000)
})
