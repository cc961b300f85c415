import { SQLSTATE, sqlState } from './errors'
import { newLeaseId } from './lease-id'
import { abandoned, deadlineAt, expired } from './policy'
import type { Claimant, Lease, RequestIdentity, Sql } from './types'

/** 'busy': the row is locked right now (a completion or another take-over is committing). */
export type TakeOver = Lease | null | 'busy'

/**
 * The three take-overs below are conditional UPDATEs on the lease the caller
 * saw, with FOR UPDATE NOWAIT: of many concurrent takers exactly one wins (the
 * first locks the row, the others' NOWAIT fails at once with 55P03 and is
 * answered 409, a later one finds a new lease and updates nothing), and nobody
 * waits. The only other holder of a key's row lock is a completing
 * transaction, for one pipelined round trip (complete.ts), so NOWAIT fails
 * only in that instant, and the retry then finds the stored answer.
 */

/**
 * Takes over an abandoned processing key (policy.ts): its worker is past its
 * deadline (it stopped, or died with its process), or no live request works
 * on it (its claim's answer was lost). The request keeps its request_id, so
 * its downstream key is the same and a provider that already charged answers
 * that charge. The old worker, if it still runs, is fenced by the new lease.
 */
export function reclaim(sql: Sql, seen: Lease, claimant: Taker): Promise<TakeOver> {
  return takeOver(seen, async () => {
    const [row] = await sql<TakenRow[]>`
      with params as (select coalesce(${claimant.now ?? null}::timestamptz, now()) as now),
      target as (
        select k.tenant, k.key, k.stale_at from idempotency_keys k, params p
         where k.tenant = ${seen.tenant} and k.key = ${seen.key}
           and k.lease = ${seen.lease} and ${abandoned(sql, sql`p.now`)}
           for update of k nowait
      ),
      taken as (
        update idempotency_keys k
           set lease = ${claimant.lease ?? newLeaseId()}::bigint, locked_at = p.now, stale_at = ${deadlineAt(sql, sql`p.now`, claimant.ttlSeconds)},
               attempts = k.attempts + 1, owner = ${claimant.owner ?? null}::uuid, http_request_id = ${claimant.httpRequestId ?? null}
          from target, params p
         where k.tenant = target.tenant and k.key = target.key
        returning k.tenant, k.key, k.lease, k.attempts, k.request_id, k.locked_at, k.stale_at
      ),
      unlisted as (
        delete from idempotency_processing pr using target t
         where pr.stale_at = t.stale_at and pr.tenant = t.tenant and pr.key = t.key
      ),
      ${listTaken(sql)}`
    return row
  })
}

/**
 * Runs a released key again. The same request keeps its request_id, so a
 * charge its failed execution made is found, not repeated; past its
 * retention (`sameRequest` false) the key is bound anew, to a new request.
 */
export function retakeReleased(sql: Sql, id: RequestIdentity, seen: Lease, sameRequest: boolean, claimant: Taker): Promise<TakeOver> {
  return takeOver(id, async () => {
    const [row] = await sql<TakenRow[]>`
      with params as (select coalesce(${claimant.now ?? null}::timestamptz, now()) as now),
      target as (
        select k.tenant, k.key from idempotency_keys k
         where k.tenant = ${id.tenant} and k.key = ${id.key}
           and k.status = 'released' and k.lease = ${seen.lease}
           for update of k nowait
      ),
      taken as (
        update idempotency_keys k
           set status = 'processing', released_at = null, release_reason = null,
               lease = ${claimant.lease ?? newLeaseId()}::bigint, locked_at = p.now, stale_at = ${deadlineAt(sql, sql`p.now`, claimant.ttlSeconds)},
               owner = ${claimant.owner ?? null}::uuid, http_request_id = ${claimant.httpRequestId ?? null},
               ${sameRequest
                 ? sql`attempts = k.attempts + 1`
                 : sql`method = ${id.method}, path = ${id.path}, fingerprint = ${id.fingerprint}, request_id = gen_random_uuid(), attempts = 1, created_at = p.now,
                       summary = ${claimant.summary ? sql.json(claimant.summary) : null}::jsonb`}
          from target, params p
         where k.tenant = target.tenant and k.key = target.key
        returning k.tenant, k.key, k.lease, k.attempts, k.request_id, k.locked_at, k.stale_at
      ),
      ${listTaken(sql)}`
    return row
  })
}

/**
 * Turns a completed key past its retention into a fresh claim for a new
 * request, with a new request_id (so a new downstream key: the old charge is
 * not this request's).
 */
export function renewExpired(sql: Sql, id: RequestIdentity, seenLease: string, claimant: Taker): Promise<TakeOver> {
  return takeOver(id, async () => {
    const [row] = await sql<TakenRow[]>`
      with params as (select coalesce(${claimant.now ?? null}::timestamptz, now()) as now),
      target as (
        select k.tenant, k.key from idempotency_keys k, params p
         where k.tenant = ${id.tenant} and k.key = ${id.key}
           and k.lease = ${seenLease} and ${expired(sql, sql`p.now`, claimant.retentionSeconds)}
           for update of k nowait
      ),
      taken as (
        update idempotency_keys k
           set method = ${id.method}, path = ${id.path}, fingerprint = ${id.fingerprint}, request_id = gen_random_uuid(),
               status = 'processing', lease = ${claimant.lease ?? newLeaseId()}::bigint, attempts = 1, owner = ${claimant.owner ?? null}::uuid,
               http_request_id = ${claimant.httpRequestId ?? null},
               created_at = p.now, locked_at = p.now, stale_at = ${deadlineAt(sql, sql`p.now`, claimant.ttlSeconds)}, completed_at = null,
               response_status = null, response_headers = null, response_body = null,
               summary = ${claimant.summary ? sql.json(claimant.summary) : null}::jsonb
          from target, params p
         where k.tenant = target.tenant and k.key = target.key
        returning k.tenant, k.key, k.lease, k.attempts, k.request_id, k.locked_at, k.stale_at
      ),
      ${listTaken(sql)}`
    return row
  })
}

interface TakenRow { lease: string; attempts: number; request_id: string }

/** The end of every take-over: the taken key listed in processing under its new deadline, and its new lease. */
function listTaken(sql: Sql) {
  return sql`
      listed as (
        insert into idempotency_processing (stale_at, tenant, key, locked_at)
        select stale_at, tenant, key, locked_at from taken
      )
      select lease::text as lease, attempts, request_id::text as request_id from taken`
}

/** A claimant, with the lease it takes the key under (drawn by the caller, lease-id.ts; @default a new one). */
export type Taker = Claimant

/** Runs a conditional take-over UPDATE: its new lease, null if its condition no longer held, 'busy' on NOWAIT. */
async function takeOver(key: { tenant: string; key: string }, update: () => Promise<TakenRow | undefined>): Promise<TakeOver> {
  try {
    const row = await update()
    return row ? { tenant: key.tenant, key: key.key, lease: row.lease, attempts: row.attempts, requestId: row.request_id } : null
  } catch (error) {
    if (sqlState(error) === SQLSTATE.LOCK_NOT_AVAILABLE) return 'busy'
    throw error
  }
}
