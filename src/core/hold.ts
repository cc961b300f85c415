import { HELD_MARK } from './policy'
import type { Lease, Sql } from './types'

/**
 * Holds a processing key whose foreign call's outcome is unknown (the gateway's
 * `hold` rule: its upstream may have acted, and may not dedupe): the key stays
 * in processing, so every retry is answered 409 until its TTL, but it is marked
 * (`held` in its summary, with why), so an operator may release it before then
 * (policy.ts forceExpirable), and the admin page and the CLI show why it waits.
 *
 * Only a key claimed with no owner can be held: with one, the owner's
 * heartbeat decides whether it is worked on (policy.ts workedOn). Conditional
 * on our lease, like a release: a key taken over meanwhile is left alone.
 */
export async function hold(sql: Sql, lease: Pick<Lease, 'tenant' | 'key' | 'lease'>, why: string): Promise<boolean> {
  const rows = await sql`
    update idempotency_keys k
       set summary = coalesce(k.summary, '{}'::jsonb) || jsonb_build_object(${HELD_MARK}::text, ${why}::text)
     where k.tenant = ${lease.tenant} and k.key = ${lease.key} and k.lease = ${lease.lease}
       and k.status = 'processing' and k.owner is null
    returning 1`
  if (rows.length === 1) return true
  // A key of the new form (sql/engine/00020): its request in flight is its processing entry.
  const entries = await sql`
    update idempotency_processing pr
       set summary = coalesce(pr.summary, '{}'::jsonb) || jsonb_build_object(${HELD_MARK}::text, ${why}::text)
     where pr.tenant = ${lease.tenant} and pr.key = ${lease.key} and pr.lease = ${lease.lease} and pr.owner is null
    returning 1`
  return entries.length === 1
}
