import { SQLSTATE, sqlState } from './errors'
import { expired, stale } from './policy'
import type postgres from 'postgres'
import type { ClaimSummary } from './claim'
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
 * Takes over a stale processing key: its worker is past its deadline (it
 * stopped, or died with its process). The request keeps its request_id, so
 * its downstream key is the same and a provider that already charged answers
 * that charge. The old worker, if it still runs, is fenced by the new lease.
 */
export function reclaim(sql: Sql, seen: Lease, claimant: Claimant): Promise<TakeOver> {
  return takeOver(seen, async () => {
    const [row] = await sql<TakenRow[]>`
      with params as (select coalesce(${claimant.now ?? null}::timestamptz, now()) as now),
      target as (
        select k.tenant, k.key from idempotency_keys k, params p
         where k.tenant = ${seen.tenant} and k.key = ${seen.key}
           and k.lease = ${seen.lease} and ${stale(sql, sql`p.now`, claimant.ttlSeconds)}
           for update of k nowait
      )
      update idempotency_keys k
         set lease = nextval('idempotency_lease_seq'), locked_at = p.now, attempts = k.attempts + 1, owner = ${claimant.owner ?? null}::uuid
        from target, params p
       where k.tenant = target.tenant and k.key = target.key
      returning k.lease, k.attempts, k.request_id`
    return row
  })
}

/**
 * Runs a released key again. The same request (same fingerprint) keeps its
 * request_id, so a charge its failed execution made is found, not repeated;
 * another request under the key is new, and gets a new request_id.
 */
export function retakeReleased(sql: Sql, id: RequestIdentity, seen: Lease, sameRequest: boolean, claimant: Claimant): Promise<TakeOver> {
  return takeOver(id, async () => {
    const [row] = await sql<TakenRow[]>`
      with params as (select coalesce(${claimant.now ?? null}::timestamptz, now()) as now),
      target as (
        select k.tenant, k.key from idempotency_keys k
         where k.tenant = ${id.tenant} and k.key = ${id.key}
           and k.status = 'released' and k.lease = ${seen.lease}
           for update of k nowait
      )
      update idempotency_keys k
         set status = 'processing', released_at = null, lease = nextval('idempotency_lease_seq'), locked_at = p.now, owner = ${claimant.owner ?? null}::uuid,
             ${sameRequest
               ? sql`attempts = k.attempts + 1`
               : sql`method = ${id.method}, path = ${id.path}, fingerprint = ${id.fingerprint}, request_id = gen_random_uuid(), attempts = 1, created_at = p.now, summary = ${summaryOf(sql, id)}::jsonb`}
        from target, params p
       where k.tenant = target.tenant and k.key = target.key
      returning k.lease, k.attempts, k.request_id`
    return row
  })
}

/**
 * Turns a completed key past its retention into a fresh claim for a new
 * request, with a new request_id (so a new downstream key: the old charge is
 * not this request's).
 */
export function renewExpired(sql: Sql, id: RequestIdentity, seenLease: string, claimant: Claimant): Promise<TakeOver> {
  return takeOver(id, async () => {
    const [row] = await sql<TakenRow[]>`
      with params as (select coalesce(${claimant.now ?? null}::timestamptz, now()) as now),
      target as (
        select k.tenant, k.key from idempotency_keys k, params p
         where k.tenant = ${id.tenant} and k.key = ${id.key}
           and k.lease = ${seenLease} and ${expired(sql, sql`p.now`, claimant.retentionSeconds)}
           for update of k nowait
      )
      update idempotency_keys k
         set method = ${id.method}, path = ${id.path}, fingerprint = ${id.fingerprint}, request_id = gen_random_uuid(), summary = ${summaryOf(sql, id)}::jsonb,
             status = 'processing', lease = nextval('idempotency_lease_seq'), attempts = 1, owner = ${claimant.owner ?? null}::uuid,
             created_at = p.now, locked_at = p.now, completed_at = null,
             response_status = null, response_headers = null, response_body = null
        from target, params p
       where k.tenant = target.tenant and k.key = target.key
      returning k.lease, k.attempts, k.request_id`
    return row
  })
}

/** A new request under an old key gets its own summary (sql/00006), never the previous request's. */
function summaryOf(sql: Sql, id: RequestIdentity & ClaimSummary) {
  return id.summary === undefined ? null : sql.json(id.summary as postgres.JSONValue)
}

interface TakenRow { lease: string; attempts: number; request_id: string }

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
