import { cutoffText, retentionEndText } from '../core/policy'
import type { Sql } from '../core/types'

const NOW = 'coalesce($1::timestamptz, now())'

/**
 * $1 now (null: the database's), $2 the retention in seconds.
 *
 * How long past its retention the key the purge deletes next has waited: the
 * oldest completed or released key past retention, by created_at, the order
 * the purge deletes in (core/purge.ts), with the policy's cut-offs. 0 when
 * there is none. Whatever stops the purge (no process running one, a purging
 * process whose runs fail, a purge slower than the ingest) shows here, since
 * it is read from the keys rather than from any process.
 *
 * Cost: the first rows of idempotency_keys_created_at from the oldest, up to
 * the first key past retention; keys created before the cut-off and not yet
 * expired (completed late, released recently, stuck in processing) are the
 * only ones read before it, a handful: 0.3-0.5 ms on 3 M keys, vacuumed. Keys
 * the purge deleted stay in the index until vacuum, and the first read after
 * walks their entries, marking them dead as it goes: after 1 M deleted at once,
 * 1,134 ms (past the gauges' 1 s timeout, once), then 38 and 7.6 ms. A purge
 * deletes a few seconds' worth between two refreshes.
 *
 * A key of the new form (sql/engine/00020) is judged by its answer, probed
 * per key the scan reaches (policy.ts answeredExpired), never by a join the
 * planner could turn into a read of the whole answer table (the purge's
 * statement did: core/purge.ts).
 *
 * Concurrency: a plain MVCC read, no row locks, under the gauges' statement
 * timeout (gauges.ts).
 */
export const PURGE_OVERDUE_SQL = `
  select coalesce(max(extract(epoch from ${NOW} - ${retentionEndText('$2::float8')})), 0)::float8 as overdue
    from (select coalesce(k.completed_at, (select a.completed_at from idempotency_answers a
                                            where k.digest is not null and a.tenant = k.tenant and a.request_id = k.request_id)) as completed_at,
                 k.released_at
            from idempotency_keys k
           where ${cutoffText('retentionCandidate', NOW, '$2::float8')}
             and (${cutoffText('expired', NOW, '$2::float8')} or ${cutoffText('releasedExpired', NOW, '$2::float8')}
                  or ${cutoffText('answeredExpired', NOW, '$2::float8')})
           order by k.created_at
           limit 1) k`

export function purgeOverdueParameters(retentionSeconds: number, now?: Date): [Date | null, number] {
  return [now ?? null, retentionSeconds]
}

/** Seconds past its retention of the next key the purge deletes; 0 when none waits. */
export async function readPurgeOverdue(sql: Sql, retentionSeconds: number, now?: Date): Promise<number> {
  const [row] = await sql.unsafe<{ overdue: number }[]>(PURGE_OVERDUE_SQL, purgeOverdueParameters(retentionSeconds, now))
  return Math.max(0, row?.overdue ?? 0)
}
