import type { Lease, Sql } from './types'

/**
 * Gives a key back after its work failed, so a retry runs afresh.
 * Conditional on our lease: if the key was taken over meanwhile, the new
 * owner's claim is left alone. Runs after our transaction rolled back, so it
 * can wait only on a reclaimer's brief lock, never on a worker's.
 */
export async function release(sql: Sql, lease: Lease): Promise<boolean> {
  const rows = await sql`
    delete from idempotency_keys
     where tenant = ${lease.tenant} and key = ${lease.key}
       and lease = ${lease.lease} and status = 'processing'`
  return rows.count === 1
}
