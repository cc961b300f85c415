import type { Lease, Sql } from './types'

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
export async function release(sql: Sql, lease: Pick<Lease, 'tenant' | 'key' | 'lease'>): Promise<boolean> {
  const rows = await sql`
    update idempotency_keys set status = 'released', owner = null, released_at = now()
     where tenant = ${lease.tenant} and key = ${lease.key}
       and lease = ${lease.lease} and status = 'processing'`
  return rows.count === 1
}
