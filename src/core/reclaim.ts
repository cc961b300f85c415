import { SQLSTATE, sqlState } from './errors'
import type { Lease, RequestIdentity, Sql, Timing } from './types'

/** 'busy': a live worker holds the row (its transaction has it FOR UPDATE). */
export type TakeOver = Lease | null | 'busy'

/**
 * Takes over a stale processing key whose worker is gone.
 *
 * Conditional on the lease the caller saw, so of many concurrent reclaimers
 * exactly one wins: the first locks the row, the others' NOWAIT fails at once
 * (55P03, answered 409), and a later one finds a new lease and updates nothing.
 * NOWAIT also protects a live worker: it holds its key FOR UPDATE for the whole
 * of its processing (lease.ts), so a slow but alive worker is never robbed,
 * and nobody waits behind it. A worker that died lost its lock with its
 * connection, so its key is taken here once the TTL has passed.
 */
export function reclaim(sql: Sql, seen: Lease, timing: Timing): Promise<TakeOver> {
  return takeOver(seen, async () => {
    const [row] = await sql<{ lease: string; attempts: number }[]>`
      with params as (select coalesce(${timing.now ?? null}::timestamptz, now()) as now),
      target as (
        select k.tenant, k.key from idempotency_keys k, params p
         where k.tenant = ${seen.tenant} and k.key = ${seen.key}
           and k.status = 'processing' and k.lease = ${seen.lease}
           and k.locked_at <= p.now - make_interval(secs => ${timing.ttlSeconds})
           for update of k nowait
      )
      update idempotency_keys k
         set lease = nextval('idempotency_lease_seq'), locked_at = p.now, attempts = k.attempts + 1
        from target, params p
       where k.tenant = target.tenant and k.key = target.key
      returning k.lease, k.attempts`
    return row
  })
}

/**
 * Turns a completed key past its retention into a fresh claim for a new
 * request. Conditional on the lease seen, with NOWAIT, for the same reasons
 * as reclaim: one winner, nobody waits.
 */
export function renewExpired(sql: Sql, id: RequestIdentity, seenLease: string, timing: Timing): Promise<TakeOver> {
  return takeOver(id, async () => {
    const [row] = await sql<{ lease: string; attempts: number }[]>`
      with params as (select coalesce(${timing.now ?? null}::timestamptz, now()) as now),
      target as (
        select k.tenant, k.key from idempotency_keys k, params p
         where k.tenant = ${id.tenant} and k.key = ${id.key}
           and k.status = 'done' and k.lease = ${seenLease}
           and k.completed_at <= p.now - make_interval(secs => ${timing.retentionSeconds})
           for update of k nowait
      )
      update idempotency_keys k
         set method = ${id.method}, path = ${id.path}, fingerprint = ${id.fingerprint},
             status = 'processing', lease = nextval('idempotency_lease_seq'), attempts = 1,
             created_at = p.now, locked_at = p.now, completed_at = null,
             response_status = null, response_headers = null, response_body = null
        from target, params p
       where k.tenant = target.tenant and k.key = target.key
      returning k.lease, k.attempts`
    return row
  })
}

/** Runs a conditional take-over UPDATE: its new lease, null if its condition no longer held, 'busy' on NOWAIT. */
async function takeOver(key: { tenant: string; key: string }, update: () => Promise<{ lease: string; attempts: number } | undefined>): Promise<TakeOver> {
  try {
    const row = await update()
    return row ? { tenant: key.tenant, key: key.key, lease: row.lease, attempts: row.attempts } : null
  } catch (error) {
    if (sqlState(error) === SQLSTATE.LOCK_NOT_AVAILABLE) return 'busy'
    throw error
  }
}
