import type { Lease, Sql } from './types'

/**
 * Why a key is given back: kept with it, so operators can tell a failure
 * from a deadline (a late charge may follow one). sql/engine/00005 checks the same
 * list.
 */
export const RELEASE_REASONS = ['failed', 'deadline', 'shutdown', 'lost_claim', 'force_expired'] as const
export type ReleaseReason = (typeof RELEASE_REASONS)[number]

/**
 * Gives a key back after its execution failed or ran into its deadline, so a
 * retry runs the request again. The row stays, as 'released', with its
 * request_id: the retry then sends the provider the same downstream key
 * (downstream-key.ts), and a charge this execution made before failing is
 * returned, not made twice. It leaves the processing list in the same
 * statement.
 *
 * Conditional on our lease: if the key was taken over meanwhile, the new
 * owner's claim is left alone. A key of the new form (sql/engine/00020) holds
 * its lease in its processing entry: `taken` deletes it under ours, and only
 * then is the key's row marked released, the request's summary moved onto it
 * (what an operator sees of a released request). Nothing of ours holds the row lock for longer
 * than a statement, so this waits on nothing (lock_timeout bounds it anyway).
 *
 * Every table reference names the tenant as a parameter, not through a join:
 * on Citus (tables distributed by tenant) that routes the whole statement to
 * the worker of the tenant's shard, one command and no two-phase commit
 * (test/citus/request-path.test.ts); a join alone made every CTE a subplan
 * sent to every shard (issue 47). The entry is found by its whole primary
 * key, the deadline read by a subquery: joined to `target` with the tenant a
 * parameter, PostgreSQL 17 and 18 planned a sequential scan of the list on
 * never-analyzed tables (test/store/request-path-plans.test.ts).
 */
export async function release(sql: Sql, lease: Pick<Lease, 'tenant' | 'key' | 'lease'>, reason: ReleaseReason = 'failed'): Promise<boolean> {
  const rows = await sql`
    with target as (
      select k.tenant, k.key, k.stale_at from idempotency_keys k
       where k.tenant = ${lease.tenant} and k.key = ${lease.key}
         and k.lease = ${lease.lease} and k.status = 'processing'
         for update of k
    ),
    released as (
      update idempotency_keys k
         set status = 'released', owner = null, released_at = now(), stale_at = null, release_reason = ${reason}
        from target t
       where k.tenant = ${lease.tenant} and k.key = t.key
      returning k.key
    ),
    unlisted as (
      delete from idempotency_processing pr
       where pr.stale_at = (select t.stale_at from target t) and pr.tenant = ${lease.tenant} and pr.key = ${lease.key}
    ),
    taken as (
      delete from idempotency_processing pr
       where pr.tenant = ${lease.tenant} and pr.key = ${lease.key} and pr.lease = ${lease.lease}
      returning pr.key, pr.summary, pr.locked_at, pr.http_request_id
    ),
    released_apart as (
      update idempotency_keys k
         set status = 'released', released_at = now(), release_reason = ${reason},
             summary = t.summary, locked_at = t.locked_at, http_request_id = t.http_request_id
        from taken t
       where k.tenant = ${lease.tenant} and k.key = t.key
      returning k.key
    )
    select 1 from released union all select 1 from released_apart`
  return rows.length === 1
}
