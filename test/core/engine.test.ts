/**
 * The engine's phases on a real PostgreSQL, with an injected clock instead of
 * sleeps: claim, completion (fence + writes + COMMIT), release, reclaim,
 * retention. Each test names the broken engine it would catch.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { downstreamKey } from '../../src/core/downstream-key'
import { LeaseLostError } from '../../src/core/errors'
import { forceExpire } from '../../src/core/force-expire'
import { reclaim } from '../../src/core/reclaim'
import { release } from '../../src/core/release'
import type { ClaimResult, Lease, StoredResponse } from '../../src/core/types'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { createKey, identity, secondsAfter } from '../support/keys'
import { KEY_STATES } from '../../src/core/key-states'

const TTL = 30
const RETENTION = 3600
const timing = (now?: Date) => ({ ttlSeconds: TTL, retentionSeconds: RETENTION, now })
const OK: StoredResponse = { status: 201, headers: { 'content-type': 'application/json' }, body: '{"ok":true}' }

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('engine')
  await db.sql`create table side_effects (key text not null, lease text not null)`
})
afterAll(() => db?.drop())

/** Completes a claimed key, recording one side effect row in the same transaction. */
function finish(lease: Lease, now?: Date) {
  return complete(db.pools.work, lease, async (tx) => {
    await tx`insert into side_effects (key, lease) values (${lease.key}, ${lease.lease})`
    return OK
  }, { now })
}

async function sideEffects(key: string): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from side_effects where key = ${key}`
  return row!.n
}

async function keyRow(id: { tenant: string; key: string }) {
  const [row] = await db.sql`select * from ${db.sql.unsafe(KEY_STATES)} k where k.tenant = ${id.tenant} and k.key = ${id.key}`
  return row
}

function leaseOf(result: ClaimResult): Lease {
  if (result.kind !== 'created' && result.kind !== 'reclaimed') throw new Error(`expected a claim, got ${result.kind}`)
  return result.lease
}

describe('claim', () => {
  test('the first claim creates, a retry while processing is in progress, after completion a replay', async () => {
    const id = identity()
    const first = leaseOf(await claim(db.pools.short, id, timing()))
    const during = await claim(db.pools.short, id, timing())
    expect(during).toEqual({ kind: 'in_progress', retryAfterSeconds: 1 })
    await finish(first)
    const after = await claim(db.pools.short, id, timing())
    expect(after).toMatchObject({ kind: 'replay', response: OK })
    expect(await sideEffects(id.key)).toBe(1)
  })

  // Catches: a claim that waits (e.g. SELECT ... FOR UPDATE / FOR SHARE on the key).
  test('a claim never waits on a row lock: it answers while another session holds the key FOR UPDATE', async () => {
    const id = identity()
    await createKey(db.sql, id, { status: 'processing' })
    const holder = await db.sql.reserve()
    try {
      await holder`begin`
      await holder`select 1 from idempotency_keys where tenant = ${id.tenant} and key = ${id.key} for update`
      // lock_timeout is 1 s on the pools: a claim that waited would fail with 55P03, not answer.
      expect((await claim(db.pools.short, id, timing())).kind).toBe('in_progress')
      expect((await claim(db.pools.short, { ...id, fingerprint: identity({ body: { other: 1 } }).fingerprint }, timing())).kind).toBe('mismatch')
    } finally {
      await holder`rollback`
      holder.release()
    }
  })

  test('a claim never waits on a completion that updated the key and has not committed (frozen before its COMMIT)', async () => {
    const id = identity()
    await createKey(db.sql, id, { status: 'processing' })
    const completion = await db.sql.reserve()
    try {
      await completion`begin`
      await completion`update idempotency_keys set attempts = attempts where tenant = ${id.tenant} and key = ${id.key}`
      // A waiting claim would fail here with 55P03 after lock_timeout (1 s), not answer.
      expect((await claim(db.pools.short, id, timing())).kind).toBe('in_progress')
      expect((await claim(db.pools.short, id, timing(secondsAfter(new Date(), TTL + 1)))).kind).toBe('in_progress') // reclaim: NOWAIT, busy
    } finally {
      await completion`rollback`
      completion.release()
    }
  })

  test('Retry-After grows with the age of the request, from 1 up to the TTL left', async () => {
    const id = identity()
    const start = new Date()
    await createKey(db.sql, id, { status: 'processing', lockedAt: start })
    expect(await claim(db.pools.short, id, timing(secondsAfter(start, 0.2)))).toEqual({ kind: 'in_progress', retryAfterSeconds: 1 })
    expect(await claim(db.pools.short, id, timing(secondsAfter(start, 4.5)))).toEqual({ kind: 'in_progress', retryAfterSeconds: 5 })
    expect(await claim(db.pools.short, id, timing(secondsAfter(start, 20.2)))).toEqual({ kind: 'in_progress', retryAfterSeconds: 10 })
    expect(await claim(db.pools.short, id, timing(secondsAfter(start, 29.9)))).toEqual({ kind: 'in_progress', retryAfterSeconds: 1 })
  })

  test('a different request under the same key is a mismatch, processing or done', async () => {
    const id = identity({ body: { amount: 1 } })
    await createKey(db.sql, id, { status: 'processing' })
    const other = { ...id, fingerprint: identity({ body: { amount: 2 } }).fingerprint }
    expect(await claim(db.pools.short, other, timing())).toEqual({ kind: 'mismatch', status: 'processing' })
    const done = identity()
    await createKey(db.sql, done, { status: 'done' })
    expect(await claim(db.pools.short, { ...done, fingerprint: other.fingerprint }, timing())).toEqual({ kind: 'mismatch', status: 'done' })
  })

  test('keys are scoped by tenant', async () => {
    const id = identity({ tenant: 'acme' })
    await createKey(db.sql, id, { status: 'done' })
    const result = await claim(db.pools.short, { ...id, tenant: 'globex' }, timing())
    expect(result.kind).toBe('created')
  })

  test('a completed key past retention counts as new, even for another request, with a new downstream key', async () => {
    const id = identity()
    const completedAt = new Date()
    await createKey(db.sql, id, { status: 'done', completedAt })
    const before = (await keyRow(id))!.request_id as string
    const later = secondsAfter(completedAt, RETENTION + 1)
    const other = { ...id, fingerprint: identity({ body: { other: true } }).fingerprint }
    const renewed = leaseOf(await claim(db.pools.short, other, timing(later)))
    expect((await keyRow(id))!.status).toBe('processing')
    expect(renewed.requestId).not.toBe(before)
    // Just inside retention it is still replayed.
    const kept = identity()
    await createKey(db.sql, kept, { status: 'done', completedAt })
    expect((await claim(db.pools.short, kept, timing(secondsAfter(completedAt, RETENTION - 1)))).kind).toBe('replay')
  })
})

describe('completion', () => {
  // Catches: completion in its own transaction (the writes commit without the key, or the key without the writes).
  test('the writes and the key commit together: a recording step that fails after writing leaves neither', async () => {
    const id = identity()
    const lease = leaseOf(await claim(db.pools.short, id, timing()))
    await expect(complete(db.pools.work, lease, async (tx) => {
      await tx`insert into side_effects (key, lease) values (${id.key}, ${lease.lease})`
      throw new Error('recording failed')
    })).rejects.toThrow('recording failed')
    expect(await sideEffects(id.key)).toBe(0)
    expect((await keyRow(id))!.status).toBe('processing')
  })

  // Catches: completion in its own transaction, and a missing fence.
  test('a fenced-out completion rolls its writes back: no stored success without its writes, no writes without it', async () => {
    const id = identity()
    const start = new Date()
    const first = leaseOf(await claim(db.pools.short, id, timing(start)))
    const second = leaseOf(await claim(db.pools.short, id, timing(secondsAfter(start, TTL + 1))))
    await expect(finish(first)).rejects.toBeInstanceOf(LeaseLostError)
    expect(await sideEffects(id.key)).toBe(0)
    await finish(second)
    const effects = await db.sql`select lease from side_effects where key = ${id.key}`
    expect(effects.map((row) => row.lease)).toEqual([second.lease])
    const row = await keyRow(id)
    expect(row!.status).toBe('done')
    expect(row!.lease).toBe(second.lease)
  })

  test('a force-expired worker cannot commit, even when the operator was wrong about it being dead', async () => {
    const id = identity()
    const start = new Date()
    const lease = leaseOf(await claim(db.pools.short, id, timing(start)))
    // Past its TTL the key may be force-expired whatever its owner does.
    const result = await forceExpire(db.pools.short, { tenant: id.tenant, key: id.key, lease: lease.lease }, 'test', { now: secondsAfter(start, TTL + 1) })
    expect(result.outcome).toBe('expired')
    await expect(finish(lease)).rejects.toBeInstanceOf(LeaseLostError)
    expect(await sideEffects(id.key)).toBe(0)
    expect((await keyRow(id))!.status).toBe('released')
  })

  test('completed_at is the clock at completion, not the transaction\'s start', async () => {
    const id = identity()
    const lease = leaseOf(await claim(db.pools.short, id, timing()))
    const started = (await db.sql<{ started: Date }[]>`select clock_timestamp() as started`)[0]!.started
    await complete(db.pools.work, lease, async (tx) => {
      await tx`select pg_sleep(0.6)` // a slow write inside the completing transaction
      return OK
    })
    const row = await keyRow(id)
    expect((row!.completed_at as Date).getTime() - started.getTime()).toBeGreaterThanOrEqual(550)
  })

  test('nothing holds the key\'s row between the claim and the completion (the external phase holds no lock)', async () => {
    const id = identity()
    const lease = leaseOf(await claim(db.pools.short, id, timing()))
    // NOWAIT fails at once on any lock held by anyone.
    const [row] = await db.sql`select lease from idempotency_keys where tenant = ${id.tenant} and key = ${id.key} for update nowait`
    expect(row!.lease).toBe(lease.lease)
    const locks = await db.sql`select 1 from pg_stat_activity where state like 'idle in transaction%' and datname = current_database()`
    expect(locks).toHaveLength(0)
  })
})

describe('reclaim', () => {
  test('a dead worker\'s stale key is reclaimed by exactly one of many concurrent retries, keeping its request', async () => {
    const id = identity()
    const lockedAt = new Date()
    await createKey(db.sql, id, { status: 'processing', lockedAt })
    const requestId = (await keyRow(id))!.request_id
    const now = secondsAfter(lockedAt, TTL + 1)
    const results = await Promise.all(Array.from({ length: 40 }, () => claim(db.pools.short, id, timing(now))))
    const kinds = results.map((r) => r.kind)
    expect(kinds.filter((k) => k === 'reclaimed')).toHaveLength(1)
    expect(kinds.filter((k) => k !== 'reclaimed').every((k) => k === 'in_progress')).toBe(true)
    const row = await keyRow(id)
    expect(row!.attempts).toBe(2)
    expect(row!.request_id).toBe(requestId)
  })

  test('a fresh key is not reclaimed before its TTL', async () => {
    const id = identity()
    const lockedAt = new Date()
    const { lease } = await createKey(db.sql, id, { status: 'processing', lockedAt })
    const requestId = (await keyRow(id))!.request_id as string
    expect(await reclaim(db.pools.short, { tenant: id.tenant, key: id.key, lease, attempts: 1, requestId }, timing(secondsAfter(lockedAt, TTL - 1)))).toBeNull()
  })
})

describe('release', () => {
  test('a failed execution releases the key; the retry runs again as the same request', async () => {
    const id = identity()
    const first = leaseOf(await claim(db.pools.short, id, timing()))
    expect(await release(db.pools.short, first)).toBe(true)
    const row = await keyRow(id)
    expect(row!.status).toBe('released')
    const again = await claim(db.pools.short, id, timing())
    expect(again.kind).toBe('created')
    const retry = leaseOf(again)
    expect(retry.lease).not.toBe(first.lease)
    expect(retry.requestId).toBe(first.requestId)
    expect(retry.attempts).toBe(2)
    await finish(retry)
    expect(await sideEffects(id.key)).toBe(1)
  })

  // Catches: a released key rebound to whatever body comes next (a new request id, so a new downstream key: a second charge).
  test('another request under a released key is a mismatch within the retention, and a new request only past it', async () => {
    const id = identity({ body: { amount: 1 } })
    const first = leaseOf(await claim(db.pools.short, id, timing()))
    await release(db.pools.short, first)
    const other = { ...id, fingerprint: identity({ body: { amount: 2 } }).fingerprint }
    expect(await claim(db.pools.short, other, timing())).toEqual({ kind: 'mismatch', status: 'released' })
    const [row] = await db.sql<{ released_at: Date }[]>`select released_at from idempotency_keys where tenant = ${id.tenant} and key = ${id.key}`
    const renewed = leaseOf(await claim(db.pools.short, other, timing(secondsAfter(row!.released_at, RETENTION + 1))))
    expect(renewed.requestId).not.toBe(first.requestId)
    expect(renewed.attempts).toBe(1)
  })

  // Catches: an unconditional release (one that ignores the lease).
  test('a release by a worker that lost its lease leaves the new owner\'s claim alone', async () => {
    const id = identity()
    const start = new Date()
    const first = leaseOf(await claim(db.pools.short, id, timing(start)))
    const second = leaseOf(await claim(db.pools.short, id, timing(secondsAfter(start, TTL + 1))))
    expect(await release(db.pools.short, first)).toBe(false)
    const row = await keyRow(id)
    expect(row!.status).toBe('processing')
    expect(row!.lease).toBe(second.lease)
    // The retry of a client is still told it is in progress, not handed a fresh run.
    expect((await claim(db.pools.short, id, timing(secondsAfter(start, TTL + 2)))).kind).toBe('in_progress')
  })

  test('leases are never reused, even after a key is released and claimed again', async () => {
    const id = identity()
    const first = leaseOf(await claim(db.pools.short, id, timing()))
    await release(db.pools.short, first)
    const again = leaseOf(await claim(db.pools.short, id, timing()))
    expect(again.lease).not.toBe(first.lease)
    await expect(finish(first)).rejects.toBeInstanceOf(LeaseLostError)
    expect(await sideEffects(id.key)).toBe(0)
  })
})

describe('downstream key', () => {
  // Catches: a downstream key that changes per attempt (derived from the lease or the attempt).
  test('is the same across a release, a reclaim and a force-expire of the same request', async () => {
    const id = identity()
    const start = new Date()
    const first = leaseOf(await claim(db.pools.short, id, timing(start)))
    await release(db.pools.short, first)
    const second = leaseOf(await claim(db.pools.short, id, timing(start)))
    const third = leaseOf(await claim(db.pools.short, id, timing(secondsAfter(start, TTL + 1))))
    await forceExpire(db.pools.short, { tenant: id.tenant, key: id.key, lease: third.lease }, 'test', { now: secondsAfter(start, 3 * TTL) })
    const fourth = leaseOf(await claim(db.pools.short, id, timing(secondsAfter(start, 3 * TTL))))
    const keys = new Set([first, second, third, fourth].map(downstreamKey))
    expect(new Set([first, second, third, fourth].map((lease) => lease.lease)).size).toBe(4)
    expect(keys.size).toBe(1)
  })

  test('differs between tenants using the same key string', async () => {
    const key = crypto.randomUUID()
    const acme = leaseOf(await claim(db.pools.short, identity({ tenant: 'acme', key }), timing()))
    const globex = leaseOf(await claim(db.pools.short, identity({ tenant: 'globex', key }), timing()))
    expect(downstreamKey(acme)).not.toBe(downstreamKey(globex))
  })

  test('differs for a new request under a key whose retention ended', async () => {
    const id = identity()
    const start = new Date()
    const first = leaseOf(await claim(db.pools.short, id, timing(start)))
    await finish(first, start)
    const renewed = leaseOf(await claim(db.pools.short, id, timing(secondsAfter(start, RETENTION + 1))))
    expect(downstreamKey(renewed)).not.toBe(downstreamKey(first))
  })
})
