import { answeredExpired, expired, releasedExpired, stale } from '../core/policy'
import { readKeptRetentionSeconds } from '../core/processes'
import type { OperationsContext } from './context'
import { filterConditions, type KeyFilters } from './filters'
import { KEY_STATES } from '../core/key-states'

export interface KeyCounts {
  /** Keys in processing matching the filters (tenant, route, key). */
  readonly processing: number
  /** Of those, past the TTL. */
  readonly stale: number
  /** What the list shows under the same filters, the stale filter included. */
  readonly matching: number
  readonly oldestProcessingAgeSeconds: number | null
  /** Done and released keys past retention, matching the filters: what a purge deletes now. */
  readonly expired: number
  /** All completed keys matching the filters; only when asked for (`withDone`), as it scans every one of them. */
  readonly done?: number | undefined
}

/**
 * Counts keys by state under the list's filters, so a page that lists one
 * tenant's keys never says another tenant's numbers. Reads only, no locks.
 *
 * Processing keys are counted in one pass over idempotency_processing (count,
 * stale count, matching and oldest together), which holds them and nothing
 * else. Expired keys are a range of the created_at index (policy.ts), small
 * while the purge keeps up.
 */
export async function countKeys(context: OperationsContext, filters: KeyFilters, options: { withDone?: boolean } = {}): Promise<KeyCounts> {
  const { sql } = context
  const now = context.now?.() ?? null
  const retentionSeconds = await readKeptRetentionSeconds(sql, context.retentionSeconds)
  const [row] = await sql<{ processing: number; stale: number; oldest: number | null; expired: number; done: number | null }[]>`
    with params as (select coalesce(${now}::timestamptz, now()) as now),
    processing as (
      select count(*)::int as processing,
             (count(*) filter (where ${stale(sql, sql`p.now`)}))::int as stale,
             greatest(0, extract(epoch from (p.now - min(k.locked_at))))::float8 as oldest
        from idempotency_processing pr
        join ${sql.unsafe(KEY_STATES)} k on k.tenant = pr.tenant and k.key = pr.key, params p
       where k.status = 'processing' ${filterConditions(sql, filters)}
       group by p.now
    )
    select coalesce((select processing from processing), 0) as processing,
           coalesce((select stale from processing), 0) as stale,
           (select oldest from processing) as oldest,
           (select count(*)::int from idempotency_keys k
             where (${expired(sql, now, retentionSeconds)} or ${answeredExpired(sql, now, retentionSeconds)}) ${filterConditions(sql, filters)})
         + (select count(*)::int from idempotency_keys k
             where ${releasedExpired(sql, now, retentionSeconds)} ${filterConditions(sql, filters)}) as expired,
           ${options.withDone ? sql`(select count(*)::int from ${sql.unsafe(KEY_STATES)} k where k.status = 'done' ${filterConditions(sql, filters)})` : sql`null::int`} as done`
  const counts = row!
  return {
    processing: counts.processing,
    stale: counts.stale,
    matching: filters.staleOnly ? counts.stale : counts.processing,
    oldestProcessingAgeSeconds: counts.oldest,
    expired: counts.expired,
    ...(options.withDone ? { done: counts.done ?? 0 } : {}),
  }
}
