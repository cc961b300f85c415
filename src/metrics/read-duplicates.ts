import type { Sql } from '../core/types'

/**
 * $1 now (null: the database's), $2 window seconds, $3 the TTL.
 *
 * Counts, per tenant, the completions in the window that repeat an earlier
 * one (n - 1 per request): rows are unique per (tenant, key), so two done rows
 * with the same (tenant, path, fingerprint) are the same request (method, path
 * and canonical body) completed under two keys, the mark of a client that
 * makes a new key per retry.
 *
 * Cost: a range scan of idempotency_keys_created_at (shared with the purge)
 * over the window and one TTL before it, then a hash aggregate. A key
 * completes within its TTL of its creation unless it was reclaimed or retried
 * after a release; those few are left out, the price of having no index on
 * completed_at (which would make every completion a non-HOT update, sql/engine/00005).
 * It follows the window's keys, not the table: 41k completions in the hour
 * (1M keys over a day) took 25-70 ms on 2 cores. `now` is written inline rather than in a CTE:
 * with the CTE the planner misjudged the window and sorted on disk.
 * Measured alternatives: grouping by a 64-bit hash or prefix of the
 * fingerprint instead of the text saved nothing; an index-only scan over
 * (completed_at, tenant, path, fingerprint) was never chosen (recent rows are
 * not all-visible), see docs/reference/metrics.md.
 *
 * Concurrency: a plain MVCC read, no row locks; run under a statement timeout
 * of its own, so a slow aggregate never holds back the processing gauges.
 */
export const DUPLICATES_SQL = `
  select d.tenant, sum(d.completions - 1)::float8 as value
    from (select k.tenant, count(*) as completions
            from idempotency_keys k
           where k.created_at > coalesce($1::timestamptz, now()) - make_interval(secs => $2::float8 + $3::float8)
             and k.status = 'done'
             and k.completed_at > coalesce($1::timestamptz, now()) - make_interval(secs => $2::float8)
           group by k.tenant, k.path, k.fingerprint
          having count(*) > 1) d
   group by d.tenant`

export function duplicatesParameters(windowSeconds: number, ttlSeconds: number, now?: Date): [Date | null, number, number] {
  return [now ?? null, windowSeconds, ttlSeconds]
}

/** Duplicate completions per tenant (tenants with none are absent). */
export async function readDuplicates(sql: Sql, windowSeconds: number, ttlSeconds: number, now?: Date): Promise<Map<string, number>> {
  const rows = await sql.unsafe<{ tenant: string; value: number }[]>(DUPLICATES_SQL, duplicatesParameters(windowSeconds, ttlSeconds, now))
  return new Map(rows.map((row) => [row.tenant, row.value]))
}
