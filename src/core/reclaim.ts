import { SQLSTATE, sqlState } from './errors'
import { newLeaseId } from './lease-id'
import { abandoned, deadlineAt, expired, instant } from './policy'
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
 * Its list entry is deleted by its whole primary key (release.ts says why).
 */
export function reclaim(sql: Sql, seen: Lease, claimant: Taker): Promise<TakeOver> {
  return takeOver(sql, seen, (tx) => {
    const now = instant(tx, claimant.now)
    return tx<TakenRow[]>`
      with target as (
        select k.tenant, k.key, k.stale_at from idempotency_keys k
         where k.tenant = ${seen.tenant} and k.key = ${seen.key}
           and k.lease = ${seen.lease} and ${abandoned(tx, now)}
           for update of k nowait
      ),
      taken as (
        update idempotency_keys k
           set lease = ${claimant.lease ?? newLeaseId()}::bigint, locked_at = ${now}, stale_at = ${deadlineAt(tx, now, claimant.ttlSeconds)},
               attempts = k.attempts + 1, owner = ${claimant.owner ?? null}::uuid, http_request_id = ${claimant.httpRequestId ?? null}
          from target
         where k.tenant = ${seen.tenant} and k.key = target.key
        returning k.lease::text as lease, k.attempts, k.request_id::text as request_id
      ),
      unlisted as (
        delete from idempotency_processing pr
         where pr.stale_at = (select t.stale_at from target t) and pr.tenant = ${seen.tenant} and pr.key = ${seen.key}
      )
      select * from taken`
  })
}

/**
 * Runs a released key again. The same request keeps its request_id, so a
 * charge its failed execution made is found, not repeated; past its
 * retention (`sameRequest` false) the key is bound anew, to a new request.
 */
export function retakeReleased(sql: Sql, id: RequestIdentity, seen: Lease, sameRequest: boolean, claimant: Taker): Promise<TakeOver> {
  return takeOver(sql, id, (tx) => {
    const now = instant(tx, claimant.now)
    return tx<TakenRow[]>`
      with target as (
        select k.tenant, k.key from idempotency_keys k
         where k.tenant = ${id.tenant} and k.key = ${id.key}
           and k.status = 'released' and k.lease = ${seen.lease}
           for update of k nowait
      )
      update idempotency_keys k
         set status = 'processing', released_at = null, release_reason = null,
             lease = ${claimant.lease ?? newLeaseId()}::bigint, locked_at = ${now}, stale_at = ${deadlineAt(tx, now, claimant.ttlSeconds)},
             owner = ${claimant.owner ?? null}::uuid, http_request_id = ${claimant.httpRequestId ?? null},
             ${sameRequest
               ? tx`attempts = k.attempts + 1`
               : tx`method = ${id.method}, path = ${id.path}, fingerprint = ${id.fingerprint}, request_id = ${crypto.randomUUID()}::uuid, attempts = 1, created_at = ${now},
                     summary = ${claimant.summary ? tx.json(claimant.summary) : null}::jsonb`}
        from target
       where k.tenant = ${id.tenant} and k.key = target.key
      returning k.lease::text as lease, k.attempts, k.request_id::text as request_id`
  })
}

/**
 * Turns a completed key past its retention into a fresh claim for a new
 * request, with a new request_id (so a new downstream key: the old charge is
 * not this request's).
 */
export function renewExpired(sql: Sql, id: RequestIdentity, seenLease: string, claimant: Taker): Promise<TakeOver> {
  return takeOver(sql, id, (tx) => {
    const now = instant(tx, claimant.now)
    return tx<TakenRow[]>`
      with target as (
        select k.tenant, k.key from idempotency_keys k
         where k.tenant = ${id.tenant} and k.key = ${id.key}
           and k.lease = ${seenLease} and ${expired(tx, now, claimant.retentionSeconds)}
           for update of k nowait
      )
      update idempotency_keys k
         set method = ${id.method}, path = ${id.path}, fingerprint = ${id.fingerprint}, request_id = ${crypto.randomUUID()}::uuid,
             status = 'processing', lease = ${claimant.lease ?? newLeaseId()}::bigint, attempts = 1, owner = ${claimant.owner ?? null}::uuid,
             http_request_id = ${claimant.httpRequestId ?? null},
             created_at = ${now}, locked_at = ${now}, stale_at = ${deadlineAt(tx, now, claimant.ttlSeconds)}, completed_at = null,
             response_status = null, response_headers = null, response_body = null,
             summary = ${claimant.summary ? tx.json(claimant.summary) : null}::jsonb
        from target
       where k.tenant = ${id.tenant} and k.key = target.key
      returning k.lease::text as lease, k.attempts, k.request_id::text as request_id`
  })
}

interface TakenRow { lease: string; attempts: number; request_id: string }

/** A claimant, with the lease it takes the key under (drawn by the caller, lease-id.ts; @default a new one). */
export type Taker = Claimant

/**
 * Runs a conditional take-over in a transaction with the listing of the taken
 * key under its new deadline (idempotency_processing): its new lease, null if
 * its condition no longer held, 'busy' on NOWAIT.
 *
 * Two statements, not one with the listing as a CTE: Citus routes to one
 * worker a statement whose CTEs select, update and delete, never one that
 * inserts in a CTE (issue 47: the reclaim went to every worker, failed there,
 * and after a crash 15 of 16 keys stayed stuck). The transaction reaches the
 * tenant's worker alone and commits there in one phase. Take-overs are rare
 * (a crash, a release, a retention's end): the round trips cost no throughput.
 */
async function takeOver(sql: Sql, key: { tenant: string; key: string }, update: (tx: Sql) => Promise<TakenRow[]>): Promise<TakeOver> {
  const run = async (tx: Sql) => {
    const [row] = await update(tx)
    if (row) {
      // Its deadline read back from the row, to the microsecond: the entry must match it to be deleted by the completion.
      await tx`insert into idempotency_processing (stale_at, tenant, key, locked_at)
               select k.stale_at, k.tenant, k.key, k.locked_at from idempotency_keys k
                where k.tenant = ${key.tenant} and k.key = ${key.key} and k.status = 'processing'`
    }
    return row
  }
  try {
    const row = await inTransaction(sql, run)
    return row ? { tenant: key.tenant, key: key.key, lease: row.lease, attempts: row.attempts, requestId: row.request_id } : null
  } catch (error) {
    if (sqlState(error) === SQLSTATE.LOCK_NOT_AVAILABLE) return 'busy'
    throw error
  }
}

/** `work` in a transaction: a pool's own, the caller's (a transaction given), or BEGIN ... COMMIT on a reserved connection. */
async function inTransaction<T>(sql: Sql, work: (tx: Sql) => Promise<T>): Promise<T> {
  if ('begin' in sql && typeof sql.begin === 'function') return await sql.begin((tx) => work(tx as unknown as Sql)) as T
  if ('savepoint' in sql) return work(sql)
  await sql`begin`
  try {
    const result = await work(sql)
    await sql`commit`
    return result
  } catch (error) {
    await sql`rollback`.catch(() => undefined)
    throw error
  }
}
