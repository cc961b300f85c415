import { SQLSTATE, sqlState } from './errors'
import type { Sql } from './types'

/**
 * - expired: the key was deleted; the next retry claims it afresh.
 * - worker_alive: a live worker holds the key (its transaction has the row
 *   FOR UPDATE, see lease.ts); nothing was done.
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

/**
 * Force-expires one processing key, conditional on the lease the operator saw,
 * and records it in the audit trail.
 *
 * What it does to the row: DELETE, as release.ts does after a failure. The key
 * is then free, and the client's next retry runs afresh at once. Bumping the
 * lease instead would leave a processing row that nobody works on: every retry
 * would get 409 until the TTL passed again, which is the very wait the operator
 * wanted to end. Deleting is safe against a worker we were wrong about: leases
 * come from a sequence and never repeat, so its fence (the lease check before
 * COMMIT in lease.ts) finds no row with its lease and rolls its writes back.
 *
 * Concurrency: FOR UPDATE NOWAIT on the row. A live worker holds it FOR UPDATE
 * for its whole processing, so NOWAIT fails at once with 55P03: the worker is
 * alive, and we take nothing from it and wait on nothing. A worker completing
 * at the same instant either still holds the lock (55P03, worker_alive) or has
 * committed status = 'done' (0 rows, unchanged). The delete and its audit entry
 * are one statement, so they commit together.
 */
export async function forceExpire(sql: Sql, target: ExpireTarget, actor: string): Promise<ForceExpireResult> {
  const detail = { lease: target.lease }
  try {
    const [row] = await sql<{ id: string; outcome: ForceExpireOutcome }[]>`
      with target as (
        select tenant, key from idempotency_keys
         where tenant = ${target.tenant} and key = ${target.key}
           and lease = ${target.lease} and status = 'processing'
           for update nowait
      ),
      deleted as (
        delete from idempotency_keys k using target t
         where k.tenant = t.tenant and k.key = t.key
        returning k.attempts, k.locked_at
      )
      insert into idempotency_audit (actor, action, tenant, key, outcome, detail)
      select ${actor.slice(0, 128)}, 'force_expire', ${target.tenant}, ${target.key},
             case when d.attempts is null then 'unchanged' else 'expired' end,
             ${sql.json(detail)}::jsonb || coalesce(jsonb_build_object('attempts', d.attempts, 'locked_at', d.locked_at), '{}')
        from (select 1) one left join deleted d on true
      returning id, outcome`
    return { outcome: row!.outcome, auditId: row!.id }
  } catch (error) {
    if (sqlState(error) !== SQLSTATE.LOCK_NOT_AVAILABLE) throw error
    const [row] = await sql<{ id: string }[]>`
      insert into idempotency_audit (actor, action, tenant, key, outcome, detail)
      values (${actor.slice(0, 128)}, 'force_expire', ${target.tenant}, ${target.key}, 'worker_alive', ${sql.json(detail)})
      returning id`
    return { outcome: 'worker_alive', auditId: row!.id }
  }
}
