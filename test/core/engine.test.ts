import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { LeaseLostError } from '../../src/core/errors'
import { runWithLease } from '../../src/core/lease'
import { reclaim } from '../../src/core/reclaim'
import type { Lease, StoredResponse } from '../../src/core/types'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { createKey, identity, secondsAfter } from '../support/keys'

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
function complete(lease: Lease, now?: Date) {
  return runWithLease(db.pools.work, db.pools.short, lease, async (tx) => {
    await tx`insert into side_effects (key, lease) values (${lease.key}, ${lease.lease})`
    return OK
  }, { now })
}

async function sideEffects(key: string): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from side_effects where key = ${key}`
  return row!.n
}

async function keyRow(id: { tenant: string; key: string }) {
  const [row] = await db.sql`select * from idempotency_keys where tenant = ${id.tenant} and key = ${id.key}`
  return row
}

describe('claim', () => {
  test('the first claim creates, a retry while processing is in progress, after completion a replay', async () => {
    const id = identity()
    const first = await claim(db.pools.short, id, timing())
    expect(first.kind).toBe('created')
    const during = await claim(db.pools.short, id, timing())
    expect(during).toEqual({ kind: 'in_progress', retryAfterSeconds: 1 })
    if (first.kind !== 'created') throw new Error('unreachable')
    await complete(first.lease)
    const after = await claim(db.pools.short, id, timing())
    expect(after).toEqual({ kind: 'replay', response: OK })
    expect(await sideEffects(id.key)).toBe(1)
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

  test('a completed key past retention counts as new, even for another request', async () => {
    const id = identity()
    const completedAt = new Date()
    await createKey(db.sql, id, { status: 'done', completedAt })
    const later = secondsAfter(completedAt, RETENTION + 1)
    const other = { ...id, fingerprint: identity({ body: { other: true } }).fingerprint }
    const result = await claim(db.pools.short, other, timing(later))
    expect(result.kind).toBe('created')
    expect((await keyRow(id))!.status).toBe('processing')
    // Just inside retention it is still replayed.
    const kept = identity()
    await createKey(db.sql, kept, { status: 'done', completedAt })
    expect((await claim(db.pools.short, kept, timing(secondsAfter(completedAt, RETENTION - 1)))).kind).toBe('replay')
  })
})

describe('reclaim', () => {
  test('a dead worker\'s stale key is reclaimed by exactly one of many concurrent retries', async () => {
    const id = identity()
    const lockedAt = new Date()
    await createKey(db.sql, id, { status: 'processing', lockedAt })
    const now = secondsAfter(lockedAt, TTL + 1)
    const results = await Promise.all(Array.from({ length: 40 }, () => claim(db.pools.short, id, timing(now))))
    const kinds = results.map((r) => r.kind)
    expect(kinds.filter((k) => k === 'reclaimed')).toHaveLength(1)
    expect(kinds.filter((k) => k !== 'reclaimed').every((k) => k === 'in_progress')).toBe(true)
    const row = await keyRow(id)
    expect(row!.attempts).toBe(2)
  })

  test('a fresh key is not reclaimed before its TTL', async () => {
    const id = identity()
    const lockedAt = new Date()
    const { lease } = await createKey(db.sql, id, { status: 'processing', lockedAt })
    expect(await reclaim(db.pools.short, { tenant: id.tenant, key: id.key, lease, attempts: 1 }, timing(secondsAfter(lockedAt, TTL - 1)))).toBeNull()
  })

  test('a live worker past the TTL is not robbed: its retry is told in progress, and it completes once', async () => {
    const id = identity()
    const first = await claim(db.pools.short, id, timing())
    if (first.kind !== 'created') throw new Error('expected a claim')
    let release!: () => void
    const holding = new Promise<void>((resolve) => { release = resolve })
    let started!: () => void
    const inside = new Promise<void>((resolve) => { started = resolve })
    const worker = runWithLease(db.pools.work, db.pools.short, first.lease, async (tx) => {
      await tx`select 1` // the fence is sent before this, on the same connection
      started()
      await holding
      await tx`insert into side_effects (key, lease) values (${id.key}, ${first.lease.lease})`
      return OK
    })
    await inside
    const muchLater = secondsAfter(new Date(), TTL * 10)
    const retries = await Promise.all(Array.from({ length: 10 }, () => claim(db.pools.short, id, timing(muchLater))))
    expect(retries.every((r) => r.kind === 'in_progress')).toBe(true)
    release()
    await worker
    expect(await sideEffects(id.key)).toBe(1)
    expect((await claim(db.pools.short, id, timing())).kind).toBe('replay')
  })
})

describe('fencing', () => {
  test('a worker whose key was reclaimed cannot commit: its writes roll back, the new owner\'s count', async () => {
    const id = identity()
    const start = new Date()
    const first = await claim(db.pools.short, id, timing(start))
    if (first.kind !== 'created') throw new Error('expected a claim')
    // The first worker stalls before it starts its transaction (a GC pause, a slow
    // event loop); its key goes stale and a retry takes it over.
    const second = await claim(db.pools.short, id, timing(secondsAfter(start, TTL + 1)))
    if (second.kind !== 'reclaimed') throw new Error(`expected a reclaim, got ${second.kind}`)
    expect(second.lease.lease).not.toBe(first.lease.lease)

    // The fence comes before the work: the stale worker never reaches its provider call.
    let workStarted = false
    await expect(runWithLease(db.pools.work, db.pools.short, first.lease, async () => {
      workStarted = true
      return OK
    })).rejects.toBeInstanceOf(LeaseLostError)
    expect(workStarted).toBe(false)
    expect(await sideEffects(id.key)).toBe(0)
    await complete(second.lease)
    expect(await sideEffects(id.key)).toBe(1)
    const [effect] = await db.sql`select lease from side_effects where key = ${id.key}`
    expect(effect!.lease).toBe(second.lease.lease)
    // The lost worker's failure did not release the new owner's completed key.
    expect((await keyRow(id))!.status).toBe('done')
  })

  test('leases are never reused, even after a key is released and claimed again', async () => {
    const id = identity()
    const first = await claim(db.pools.short, id, timing())
    if (first.kind !== 'created') throw new Error('expected a claim')
    await expect(runWithLease(db.pools.work, db.pools.short, first.lease, async () => { throw new Error('provider down') })).rejects.toThrow('provider down')
    expect(await keyRow(id)).toBeUndefined() // released
    const again = await claim(db.pools.short, id, timing())
    if (again.kind !== 'created') throw new Error('expected a new claim')
    expect(again.lease.lease).not.toBe(first.lease.lease)
    // The old worker, had it survived, could not complete the new claim.
    await expect(complete(first.lease)).rejects.toBeInstanceOf(LeaseLostError)
    expect(await sideEffects(id.key)).toBe(0)
  })
})

describe('release', () => {
  test('a failed handler rolls back its writes and releases the key at once', async () => {
    const id = identity()
    const first = await claim(db.pools.short, id, timing())
    if (first.kind !== 'created') throw new Error('expected a claim')
    await expect(runWithLease(db.pools.work, db.pools.short, first.lease, async (tx) => {
      await tx`insert into side_effects (key, lease) values (${id.key}, 'x')`
      throw new Error('boom')
    })).rejects.toThrow('boom')
    expect(await sideEffects(id.key)).toBe(0)
    expect((await claim(db.pools.short, id, timing())).kind).toBe('created')
  })

  test('a handler that leaves the transaction aborted still releases the key', async () => {
    const id = identity()
    const first = await claim(db.pools.short, id, timing())
    if (first.kind !== 'created') throw new Error('expected a claim')
    await expect(runWithLease(db.pools.work, db.pools.short, first.lease, async (tx) => {
      await tx`insert into no_such_table values (1)`
      return OK
    })).rejects.toThrow()
    expect(await keyRow(id)).toBeUndefined()
  })
})
