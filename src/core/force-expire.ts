import { auditActor, insertAudit } from './audit'
import { SQLSTATE, sqlState } from './errors'
import { forceExpirable } from './policy'
import type { Clock, Sql } from './types'

/**
 * - expired: the key was released; the next retry runs the request again (with
 *   the same downstream key, so a charge already made is not made twice).
 * - worker_alive: the key is within its deadline and its owner process has a
 *   recent heartbeat: it is still being worked on; nothing was done.
 * - unchanged: the key completed, was released or reclaimed, or changed hands
 *   since the operator looked (another lease); nothing was done.
 */
export type ForceExpireOutcome = 'expired' | 'worker_alive' | 'unchanged'

/** The key as the operator saw it: the lease makes the action conditional on that sight. */
export interface ExpireTarget {
  readonly tenant: string
  readonly key: string
  readonly lease: string
}

export interface ForceExpireResult {
  readonly outcome: ForceExpireOutcome
  /** The audit entry that records this action. */
  readonly auditId: string
}

export type ForceExpireOptions = Clock

/**
 * Force-expires one processing key, conditional on the lease the operator saw,
 * and records it in the audit trail, in one statement.
 *
 * When it acts: once the key is past its TTL (every worker stops at its
 * deadline, a little before), or earlier when the owning process is gone (no
 * heartbeat for PROCESS_ALIVE_SECONDS). Before the deadline of a live owner it
 * refuses: that worker is still processing and will finish or fail on its own.
 *
 * What it does to the row: it releases it (status 'released', as a failed
 * request does), rather than bumping the lease: a processing row that nobody
 * works on would answer 409 to every retry until the TTL passed again, the
 * very wait the operator wanted to end. Safe against an operator who is wrong
 * about a worker: leases never repeat, so that worker's completion finds
 * another lease and rolls back (fencing, complete.ts).
 *
 * Concurrency: FOR UPDATE NOWAIT on the row, whose only other holder is a
 * completing transaction for one round trip: then 55P03, answered as
 * worker_alive (it is committing right now).
 */
export async function forceExpire(sql: Sql, target: ExpireTarget, actor: string, options: ForceExpireOptions): Promise<ForceExpireResult> {
  const detail = { lease: target.lease }
  const now = options.now ?? null
  const who = auditActor(actor)
  try {
    const [row] = await sql<{ id: string; outcome: ForceExpireOutcome }[]>`
      with params as (select coalesce(${now}::timestamptz, now()) as now),
      seen as (
        select k.tenant, k.key, k.stale_at, ${forceExpirable(sql, now)} as expirable
          from idempotency_keys k
         where k.tenant = ${target.tenant} and k.key = ${target.key}
           and k.lease = ${target.lease} and k.status = 'processing'
           for update of k nowait
      ),
      released as (
        update idempotency_keys k set status = 'released', owner = null, released_at = p.now, stale_at = null, release_reason = 'force_expired'
          from seen s, params p
         where k.tenant = s.tenant and k.key = s.key and s.expirable
        returning k.attempts, k.locked_at, k.request_id
      ),
      unlisted as (
        delete from idempotency_processing pr using seen s
         where s.expirable and pr.stale_at = s.stale_at and pr.tenant = s.tenant and pr.key = s.key
      ),
      seen_apart as (
        select pr.tenant, pr.key, ${forceExpirable(sql, now)} as expirable
          from idempotency_processing pr
         cross join lateral (select 'processing'::text as status, pr.stale_at, pr.owner, pr.lease, pr.locked_at, pr.summary) k
         where pr.tenant = ${target.tenant} and pr.key = ${target.key} and pr.lease = ${target.lease}
           for update of pr nowait
      ),
      taken_apart as (
        delete from idempotency_processing pr using seen_apart s
         where s.expirable and pr.tenant = ${target.tenant} and pr.key = ${target.key} and pr.lease = ${target.lease}
        returning pr.locked_at, pr.summary, pr.http_request_id
      ),
      released_apart as (
        update idempotency_keys k
           set status = 'released', released_at = p.now, release_reason = 'force_expired', summary = (select t.summary from taken_apart t),
               locked_at = (select t.locked_at from taken_apart t), http_request_id = (select t.http_request_id from taken_apart t)
          from params p
         where k.tenant = ${target.tenant} and k.key = (select s.key from seen_apart s where s.expirable)
           and exists (select 1 from taken_apart)
        returning k.attempts, (select t.locked_at from taken_apart t) as locked_at
      )
      ${insertAudit(sql, sql`
      select ${who}, 'force_expire', ${target.tenant}, ${target.key},
             case when r.attempts is not null then 'expired' when s.key is not null then 'worker_alive' else 'unchanged' end,
             ${sql.json(detail)}::jsonb || coalesce(jsonb_build_object('attempts', r.attempts, 'locked_at', r.locked_at), '{}')
        from (select 1) one
        left join (select key from seen union all select key from seen_apart) s on true
        left join (select attempts, locked_at from released union all select attempts, locked_at from released_apart) r on true`)}
      returning id, outcome`
    return { outcome: row!.outcome, auditId: row!.id }
  } catch (error) {
    if (sqlState(error) !== SQLSTATE.LOCK_NOT_AVAILABLE) throw error
    const [row] = await sql<{ id: string }[]>`
      ${insertAudit(sql, sql`values (${who}, 'force_expire', ${target.tenant}, ${target.key}, 'worker_alive', ${sql.json(detail)})`)}
      returning id`
    return { outcome: 'worker_alive', auditId: row!.id }
  }
}
