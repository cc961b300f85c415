/**
 * Liveness per request: a key is worked on only while a live process lists
 * its lease (or claimed it after that process's last complete list). A claim
 * whose answer was lost, or a request that ended without releasing its key,
 * is then taken over by the next retry and may be expired by an operator at
 * once, instead of answering 409 until the TTL.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { forceExpire } from '../../src/core/force-expire'
import { newLeaseId } from '../../src/core/lease-id'
import { PROCESS_ALIVE_SECONDS, startHeartbeat } from '../../src/core/processes'
import { operations } from '../../src/operations'
import { ownerText } from '../../src/operations/describe'
import type { Lease } from '../../src/core/types'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { identity } from '../support/keys'

const TTL = 30
const timing = { ttlSeconds: TTL, retentionSeconds: 3600 }

let db: TestDatabase
beforeAll(async () => { db = await createTestDatabase('liveness') })
afterAll(async () => { await db?.drop() })

/** A live process (fresh heartbeat) whose last list is `leases`, complete as of `asOfSecondsAgo`. */
async function liveProcess(leases: string[], asOfSecondsAgo: number | null): Promise<string> {
  const id = crypto.randomUUID()
  await db.sql`
    insert into idempotency_processes (id, pid, hostname, heartbeat_at, leases, leases_as_of)
    values (${id}, 1, 'test', now(), ${`{${leases.join(',')}}`}::bigint[],
            ${asOfSecondsAgo === null ? null : db.sql`now() - make_interval(secs => ${asOfSecondsAgo})`})`
  return id
}

/** A claim by `owner`, made `secondsAgo` ago, under a lease of ours. */
async function claimedBy(owner: string, secondsAgo: number): Promise<Lease & { fingerprint: string }> {
  const id = identity()
  const lease = newLeaseId()
  const result = await claim(db.pools.short, id, { ...timing, owner, lease, now: new Date(Date.now() - secondsAgo * 1000) })
  if (result.kind !== 'created') throw new Error(`unexpected claim: ${result.kind}`)
  expect(result.lease.lease).toBe(lease) // the service's lease, not the database's
  return { ...result.lease, fingerprint: id.fingerprint }
}

const retry = (lease: Lease & { fingerprint: string }) =>
  claim(db.pools.short, { tenant: lease.tenant, key: lease.key, method: 'POST', path: '/api/payments', fingerprint: lease.fingerprint }, { ...timing, owner: null })

describe('a live process', () => {
  // Catches: liveness judged per process (any fresh heartbeat keeps every key of that process busy).
  test('that does not list a lease it claimed before its last list: the retry takes the key over at once', async () => {
    const owner = await liveProcess([], 5)
    const lost = await claimedBy(owner, 10)
    const taken = await retry(lost)
    expect(taken.kind).toBe('reclaimed')
    if (taken.kind === 'reclaimed') {
      expect(taken.lease.requestId).toBe(lost.requestId) // same request, same downstream key
      expect(taken.lease.lease).not.toBe(lost.lease)
    }
  })

  test('that lists the lease: 409 until the TTL', async () => {
    const lease = newLeaseId()
    const id = identity()
    const owner = await liveProcess([lease], 5)
    await claim(db.pools.short, id, { ...timing, owner, lease, now: new Date(Date.now() - 10_000) })
    expect((await claim(db.pools.short, id, { ...timing, owner: null })).kind).toBe('in_progress')
  })

  // Catches: a list taken for complete though a claim was sent after it.
  test('a claim made after its last list is presumed worked on', async () => {
    const owner = await liveProcess([], 20)
    const recent = await claimedBy(owner, 1)
    expect((await retry(recent)).kind).toBe('in_progress')
  })

  test('a process that never listed (just started) is presumed to work on all its keys', async () => {
    const owner = await liveProcess([], null)
    const key = await claimedBy(owner, 10)
    expect((await retry(key)).kind).toBe('in_progress')
  })

  test('an operator may force-expire a key nobody works on, not one that is listed', async () => {
    const listed = newLeaseId()
    const owner = await liveProcess([listed], 5)
    const lost = await claimedBy(owner, 10)
    expect((await forceExpire(db.pools.short, lost, 'test', {})).outcome).toBe('expired')
    const id = identity()
    await claim(db.pools.short, id, { ...timing, owner, lease: listed, now: new Date(Date.now() - 10_000) })
    expect((await forceExpire(db.pools.short, { tenant: id.tenant, key: id.key, lease: listed }, 'test', {})).outcome).toBe('worker_alive')
  })
})

describe('the heartbeat', () => {
  // Catches: a heartbeat that does not list its leases, or whose list is not marked complete as of the beat before.
  test('lists the leases it is given, complete as of the previous beat', async () => {
    let leases = ['11', '22']
    const beat = await startHeartbeat(db.pools.short, { intervalMs: 60_000, leases: () => leases })
    try {
      const row = async () => (await db.sql<{ leases: string; leases_as_of: Date | null; heartbeat_at: Date }[]>`
        select array_to_string(leases, ',') as leases, leases_as_of, heartbeat_at from idempotency_processes where id = ${beat.id}`)[0]!
      const registered = await row()
      expect(registered.leases_as_of).toBeNull()
      await beat.beat()
      const first = await row()
      expect(first.leases).toBe('11,22')
      expect(first.leases_as_of!.getTime()).toBe(registered.heartbeat_at.getTime())
      leases = []
      await beat.beat()
      const second = await row()
      expect(second.leases).toBe('')
      expect(second.leases_as_of!.getTime()).toBe(first.heartbeat_at.getTime())
    } finally {
      await beat.stop()
    }
  })

  // Catches: a stop that does not say when it stopped, and a key page that shows the beat the stop dated back
  // (PROCESS_ALIVE_SECONDS before the stop) as the owner's last sign of life.
  test('a clean stop is gone at once, and the key it left in flight says when it stopped', async () => {
    const beat = await startHeartbeat(db.pools.short, { intervalMs: 60_000, retentionSeconds: 3600 })
    const lease = await claimedBy(beat.id, 0)
    await beat.stop()
    const [row] = await db.sql<{ stopped_at: Date | null; heartbeat_at: Date }[]>`select stopped_at, heartbeat_at from idempotency_processes where id = ${beat.id}`
    expect(row!.stopped_at!.getTime() - row!.heartbeat_at.getTime()).toBe(PROCESS_ALIVE_SECONDS * 1000)
    const detail = (await operations({ sql: db.pools.short, ttlSeconds: TTL, retentionSeconds: 3600 }).show(lease.tenant, lease.key))!
    expect(detail.owner).toMatchObject({ id: beat.id, alive: false, stoppedAt: row!.stopped_at, heartbeatAt: row!.stopped_at })
    expect(detail.owner!.heartbeatAgeSeconds!).toBeLessThan(PROCESS_ALIVE_SECONDS)
    expect(ownerText(detail)).toMatch(/: stopped \d+s ago \(shut down cleanly before this request finished\)$/)
    expect(detail.expirePreview).toBe('expire')
  })

  test('leases are drawn by the service: 63 random bits, no sequence in the database', async () => {
    const drawn = new Set(Array.from({ length: 10_000 }, () => newLeaseId()))
    expect(drawn.size).toBe(10_000)
    for (const lease of drawn) expect(BigInt(lease) > 0n && BigInt(lease) < 2n ** 63n).toBe(true)
    const [row] = await db.sql<{ sequences: number; lease_default: string }[]>`
      select (select count(*)::int from pg_class where relkind = 'S' and relname = 'idempotency_lease_seq') as sequences,
             (select pg_get_expr(d.adbin, d.adrelid) from pg_attrdef d join pg_attribute a on a.attrelid = d.adrelid and a.attnum = d.adnum
               where d.adrelid = 'idempotency_keys'::regclass and a.attname = 'lease') as lease_default`
    expect(row!.sequences).toBe(0)
    expect(row!.lease_default).not.toContain('nextval')
  })
})
