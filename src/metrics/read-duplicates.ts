import type { Sql } from '../core/types'

/**
 * $1 now (null: the database's), $2 window seconds, $3 the TTL, $4 at most
 * this many keys (the newest).
 *
 * Counts, per tenant, the completions in the window that repeat an earlier
 * one (n - 1 per request): rows are unique per (tenant, key), so two done rows
 * with the same (tenant, path, fingerprint) are the same request (method, path
 * and canonical body) completed under two keys, the mark of a client that
 * makes a new key per retry.
 *
 * Cost: a backward range scan of idempotency_keys_created_at (shared with the
 * purge) over the window and one TTL before it, stopped after the newest $4
 * keys, then a sort and a group. A key completes within its TTL of its
 * creation unless it was reclaimed or retried after a release; those few are
 * left out, the price of having no index on completed_at (which would make
 * every completion a non-HOT update, sql/engine/00005). Without the bound the
 * cost followed the window's traffic: 41k completions in the hour took 25-70
 * ms, 512,000 (about 140 payments/s) about 1 s, which is the gauges' timeout,
 * so the gauge went blind exactly where traffic is heaviest. With it the cost
 * is the bound's: 50,000 keys read in 141-150 ms where the whole hour (245,000)
 * took 977-1,096 ms (2 cores, BENCHMARKS.md). The window then covers the last
 * $4 keys' seconds, which the query returns (`covered`): at 1,000 payments/s,
 * 50 s, still minutes of a client's retries at 100/s.
 *
 * `now` is written inline rather than in a CTE: with the CTE the planner
 * misjudged the window and sorted on disk. Measured alternatives: grouping by
 * a 64-bit hash or prefix of the fingerprint instead of the text saved
 * nothing; an index-only scan over (completed_at, tenant, path, fingerprint)
 * was never chosen (recent rows are not all-visible), see
 * docs/reference/metrics.md.
 *
 * A completed key is one with a completion time: the row's in the old form,
 * its answer's in the new (sql/engine/00020), read by a subquery per key, a
 * probe of the answers' primary key; a join there could be planned as a read
 * of the whole answer table, every few seconds.
 *
 * Concurrency: a plain MVCC read, no row locks; run under a statement timeout
 * of its own, so a slow aggregate never holds back the processing gauges.
 */
export const DUPLICATES_SQL = `
  with newest as (
    select k.tenant, k.path, coalesce(k.fingerprint, encode(k.digest, 'hex')) as fingerprint, k.created_at,
           case when k.digest is null then case when k.status = 'done' then k.completed_at end
                when k.status is null then (select a.completed_at from idempotency_answers a
                                             where a.tenant = k.tenant and a.request_id = k.request_id) end as completed_at
      from idempotency_keys k
     where k.created_at > coalesce($1::timestamptz, now()) - make_interval(secs => $2::float8 + $3::float8)
     order by k.created_at desc
     limit $4::int),
  repeats as (
    select d.tenant, sum(d.completions - 1)::float8 as value
      from (select n.tenant, count(*) as completions
              from newest n
             where n.completed_at > coalesce($1::timestamptz, now()) - make_interval(secs => $2::float8)
             group by n.tenant, n.path, n.fingerprint
            having count(*) > 1) d
     group by d.tenant)
  select w.covered, r.tenant, r.value
    from (select case when count(*) < $4::int then $2::float8
                      else least($2::float8, extract(epoch from coalesce($1::timestamptz, now()) - min(n.created_at))::float8) end as covered
            from newest n) w
    left join repeats r on true`

export function duplicatesParameters(windowSeconds: number, ttlSeconds: number, maxKeys: number, now?: Date): [Date | null, number, number, number] {
  return [now ?? null, windowSeconds, ttlSeconds, maxKeys]
}

export interface Duplicates {
  /** Duplicate completions per tenant (tenants with none are absent). */
  readonly byTenant: Map<string, number>
  /** The seconds of completions counted: the window, or less where it holds more than `maxKeys` keys. */
  readonly coveredSeconds: number
}

/** Duplicate completions per tenant among the newest `maxKeys` keys of the window. */
export async function readDuplicates(sql: Sql, windowSeconds: number, ttlSeconds: number, maxKeys: number, now?: Date): Promise<Duplicates> {
  const rows = await sql.unsafe<{ covered: number; tenant: string | null; value: number | null }[]>(DUPLICATES_SQL, duplicatesParameters(windowSeconds, ttlSeconds, maxKeys, now))
  const byTenant = new Map<string, number>()
  for (const row of rows) if (row.tenant !== null) byTenant.set(row.tenant, row.value ?? 0)
  return { byTenant, coveredSeconds: rows[0]?.covered ?? windowSeconds }
}
