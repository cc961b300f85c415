import { cutoffText } from '../core/policy'
import type { Sql } from '../core/types'

export interface ProcessingGauges {
  /** Stale processing keys per tenant (tenants with none are absent). */
  readonly staleByTenant: ReadonlyMap<string, number>
  /** Age in seconds of the oldest lease in processing; 0 when none. */
  readonly oldestAgeSeconds: number
}

/**
 * $1 now (null: the database's). Stale is the policy's cut-off (core/policy.ts:
 * past the row's own deadline), the same rule the admin and the CLI count
 * with; no TTL is needed to judge it.
 *
 * Cost: both branches read only idempotency_processing (sql/engine/00005), which
 * holds in-flight and stranded keys and nothing else, a few hundred at most
 * however many completed keys wait for their retention; the stale branch is a
 * range of its primary key (test/metrics/gauge-plans.test.ts asserts the plan).
 *
 * Concurrency: a plain MVCC read. It takes no row locks, so it never waits on
 * a worker and blocks nobody; the caller runs it under a statement timeout
 * (gauges.ts).
 */
export const PROCESSING_GAUGES_SQL = `
  select pr.tenant, count(*)::float8 as value
    from idempotency_processing pr
   where ${cutoffText('staleEntry', 'coalesce($1::timestamptz, now())', '0')}
   group by pr.tenant
  union all
  select null, coalesce(extract(epoch from (coalesce($1::timestamptz, now()) - min(pr.locked_at)))::float8, 0)
    from idempotency_processing pr`

export function processingGaugeParameters(now?: Date): [Date | null] {
  return [now ?? null]
}

export async function readProcessingGauges(sql: Sql, now?: Date): Promise<ProcessingGauges> {
  const rows = await sql.unsafe<{ tenant: string | null; value: number }[]>(PROCESSING_GAUGES_SQL, processingGaugeParameters(now))
  const staleByTenant = new Map<string, number>()
  let oldestAgeSeconds = 0
  for (const row of rows) {
    if (row.tenant === null) oldestAgeSeconds = Math.max(0, row.value) // the clock of a test may run behind a lease
    else staleByTenant.set(row.tenant, row.value)
  }
  return { staleByTenant, oldestAgeSeconds }
}
