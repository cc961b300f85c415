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
  const lease = claimant.lease ?? newLeaseId()
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
           set lease = ${lease}::bigint, locked_at = ${now}, stale_at = ${deadlineAt(tx, now, claimant.ttlSeconds)},
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
      .then(async (rows) => rows.length > 0 ? rows : await tx<TakenRow[]>`
      with target as (
        -- The entry (a completion holds it between its fence and its commit) and the key row this updates: neither waited on.
        select pr.stale_at from idempotency_processing pr
          join idempotency_keys kr on kr.tenant = pr.tenant and kr.key = pr.key
          cross join lateral (select 'processing'::text as status, pr.stale_at, pr.owner, pr.lease, pr.locked_at) k
         where pr.tenant = ${seen.tenant} and pr.key = ${seen.key} and pr.lease = ${seen.lease} and ${abandoned(tx, now)}
           and kr.tenant = ${seen.tenant} and kr.key = ${seen.key}
           for update of pr, kr nowait
      ),
      moved as (
        update idempotency_processing pr
           set lease = ${lease}::bigint, locked_at = ${now}, stale_at = ${deadlineAt(tx, now, claimant.ttlSeconds)},
               owner = ${claimant.owner ?? null}::uuid, http_request_id = ${claimant.httpRequestId ?? null}
         where pr.tenant = ${seen.tenant} and pr.key = ${seen.key} and pr.lease = ${seen.lease} and exists (select 1 from target)
        returning pr.key
      )
      update idempotency_keys k set lease = ${lease}::bigint, attempts = k.attempts + 1
       where k.tenant = ${seen.tenant} and k.key = (select m.key from moved m)
      returning k.lease::text as lease, k.attempts, k.request_id::text as request_id`)
  }, claimant)
}

/**
 * Runs a released key again. The same request keeps its request_id, so a
 * charge its failed execution made is found, not repeated; past its
 * retention (`sameRequest` false) the key is bound anew, to a new request.
 */
export function retakeReleased(sql: Sql, id: RequestIdentity, seen: Lease, sameRequest: boolean, claimant: Taker): Promise<TakeOver> {
  const lease = claimant.lease ?? newLeaseId()
  return takeOver(sql, id, (tx) => inEitherForm((apart) => {
    const now = instant(tx, claimant.now)
    return tx<TakenRow[]>`
      with target as (
        select k.tenant, k.key from idempotency_keys k
         where k.tenant = ${id.tenant} and k.key = ${id.key}
           and k.status = 'released' and k.lease = ${seen.lease} and ${ofForm(tx, apart)}
           for update of k nowait
      )
      update idempotency_keys k
         set released_at = null, release_reason = null, lease = ${lease}::bigint,
             ${inFlight(tx, now, claimant, apart)},
             ${sameRequest
               ? tx`attempts = k.attempts + 1`
               : tx`method = ${id.method}, path = ${id.path}, ${fingerprintOf(tx, id.fingerprint, apart)}, request_id = ${Bun.randomUUIDv7()}::uuid, attempts = 1, created_at = ${now},
                     summary = ${claimant.summary ? tx.json(claimant.summary) : null}::jsonb`}
        from target
       where k.tenant = ${id.tenant} and k.key = target.key
      returning k.lease::text as lease, k.attempts, k.request_id::text as request_id`
  }), claimant)
}

/**
 * Turns a completed key past its retention into a fresh claim for a new
 * request, with a new request_id (so a new downstream key: the old charge is
 * not this request's).
 */
export function renewExpired(sql: Sql, id: RequestIdentity, seenLease: string, claimant: Taker): Promise<TakeOver> {
  const lease = claimant.lease ?? newLeaseId()
  return takeOver(sql, id, (tx) => inEitherForm((apart) => {
    const now = instant(tx, claimant.now)
    return tx<TakenRow[]>`
      with target as (
        select kr.tenant, kr.key, kr.request_id from idempotency_keys kr
          left join idempotency_answers a on kr.digest is not null and a.tenant = kr.tenant and a.request_id = kr.request_id
         cross join lateral (
           select kr.created_at, case when kr.digest is null then kr.status when a.request_id is not null then 'done' end as status,
                  coalesce(kr.completed_at, a.completed_at) as completed_at
         ) k
         where kr.tenant = ${id.tenant} and kr.key = ${id.key}
           and kr.lease = ${seenLease} and ${expired(tx, now, claimant.retentionSeconds)} and kr.digest is ${apart ? tx`not null` : tx`null`}
           for update of kr nowait
      ),
      forgotten as (
        delete from idempotency_answers a where a.tenant = ${id.tenant} and a.request_id = (select t.request_id from target t)
      )
      update idempotency_keys k
         set method = ${id.method}, path = ${id.path}, ${fingerprintOf(tx, id.fingerprint, apart)}, request_id = ${Bun.randomUUIDv7()}::uuid,
             lease = ${lease}::bigint, attempts = 1, ${inFlight(tx, now, claimant, apart)},
             created_at = ${now}, completed_at = null,
             response_status = null, response_headers = null, response_body = null,
             summary = ${claimant.summary ? tx.json(claimant.summary) : null}::jsonb
        from target
       where k.tenant = ${id.tenant} and k.key = target.key
      returning k.lease::text as lease, k.attempts, k.request_id::text as request_id`
  }), claimant)
}

interface TakenRow { lease: string; attempts: number; request_id: string }

/**
 * A take-over of a key in each form in turn (sql/engine/00020), one statement
 * each, until one takes it: a key is of one form, so at most one matches.
 * Apart, not one statement whose SET chooses by CASE: Citus refuses a
 * non-immutable function (now()) inside a CASE of a statement it routes.
 */
async function inEitherForm(update: (apart: boolean) => Promise<TakenRow[]>): Promise<TakenRow[]> {
  const old = await update(false)
  return old.length > 0 ? old : await update(true)
}

/** The keys of one form: the new form's row holds its fingerprint as bytes (sql/engine/00020). */
const ofForm = (tx: Sql, apart: boolean) => (apart ? tx`k.digest is not null` : tx`k.digest is null`)

/** The SET of a key's fingerprint, in its form: hex in the old, its bytes in the new. */
function fingerprintOf(tx: Sql, fingerprint: string, apart: boolean) {
  return apart ? tx`fingerprint = null, digest = decode(${fingerprint}, 'hex')` : tx`fingerprint = ${fingerprint}, digest = null`
}

/**
 * The SET of a key taken into processing, in its form: the old form's row
 * carries its request in flight; the new form's carries none of it (takeOver
 * lists it in its entry), and its status stays null.
 */
function inFlight(tx: Sql, now: ReturnType<typeof instant>, claimant: Taker, apart: boolean) {
  return apart
    ? tx`status = null, locked_at = null, stale_at = null, owner = null, http_request_id = null`
    : tx`status = 'processing', locked_at = ${now}, stale_at = ${deadlineAt(tx, now, claimant.ttlSeconds)},
         owner = ${claimant.owner ?? null}::uuid, http_request_id = ${claimant.httpRequestId ?? null}`
}

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
async function takeOver(sql: Sql, key: { tenant: string; key: string }, update: (tx: Sql) => Promise<TakenRow[]>, claimant: Taker): Promise<TakeOver> {
  const run = async (tx: Sql) => {
    const [row] = await update(tx)
    if (row) {
      // Old form: its deadline read back from the row, to the microsecond: the entry must match it to be deleted by the completion.
      // New form: the request in flight in its entry, unless the take-over moved the entry it had (reclaim).
      const now = instant(tx, claimant.now)
      await tx`insert into idempotency_processing (stale_at, tenant, key, locked_at, lease, owner, summary, http_request_id)
               select k.stale_at, k.tenant, k.key, k.locked_at, null::bigint, null::uuid, null::jsonb, null::text from idempotency_keys k
                where k.tenant = ${key.tenant} and k.key = ${key.key} and k.status = 'processing'
               union all
               select ${deadlineAt(tx, now, claimant.ttlSeconds)}, k.tenant, k.key, ${now}, k.lease,
                      ${claimant.owner ?? null}::uuid, null::jsonb, ${claimant.httpRequestId ?? null}::text
                 from idempotency_keys k
                where k.tenant = ${key.tenant} and k.key = ${key.key} and k.digest is not null and k.status is null
                  and not exists (select 1 from idempotency_processing pr
                                   where pr.tenant = ${key.tenant} and pr.key = ${key.key} and pr.lease is not null)`
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
