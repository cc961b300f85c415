import type { Lease, Sql } from './types'

/**
 * Why an execution gave its key back (stored as release_reason, sql/00006):
 * - failed: its handler or the provider failed, or the database did;
 * - deadline: it ran into its deadline: a foreign call in flight then may
 *   still have completed (the provider may have charged), so the admin lists
 *   these keys with their downstream key until a retry settles them;
 * - shutdown: a draining server stopped it (as for the deadline, a call may
 *   have gone through).
 * A force-expire (core/force-expire.ts) leaves it null: the audit trail
 * says who released the key and why.
 */
export type ReleaseReason = 'failed' | 'deadline' | 'shutdown'
export const RELEASE_REASONS: readonly ReleaseReason[] = ['failed', 'deadline', 'shutdown']

/**
 * Gives a key back after its execution failed or ran into its deadline, so a
 * retry runs the request again. The row stays, as 'released', with its
 * request_id: the retry then sends the provider the same downstream key
 * (downstream-key.ts), and a charge this execution made before failing is
 * returned, not made twice.
 *
 * Conditional on our lease: if the key was taken over meanwhile, the new
 * owner's claim is left alone. Nothing of ours holds the row lock for longer
 * than a round trip, so this waits on nothing (lock_timeout bounds it anyway).
 */
export async function release(sql: Sql, lease: Lease, reason: ReleaseReason = 'failed'): Promise<boolean> {
  const rows = await sql`
    update idempotency_keys set status = 'released', owner = null, released_at = now(), release_reason = ${reason}
     where tenant = ${lease.tenant} and key = ${lease.key}
       and lease = ${lease.lease} and status = 'processing'`
  return rows.count === 1
}
