import { cutoffText } from '../core/policy'
import type { Sql } from '../core/types'

export interface ProcessingGauges {
  /** Stale processing keys per tenant (tenants with none are absent). */
  readonly staleByTenant: ReadonlyMap<string, number>
  /** Age in seconds of the oldest lease in processing; 0 when none. */
  readonly oldestAgeSeconds: number
}

/**
 * $1 now (null: the database's), $2 TTL seconds. Stale is the policy's cut-off
 * (core/policy.ts), the same rule the admin and the CLI count with.
 *
 * Cost: both branches read only `idempotency_keys_processing`, the partial
 * index (locked_at, tenant, key) on status = 'processing': it holds in-flight
 * and stranded keys only, a few hundred at most however
 * many completed keys wait for their retention: 0.1 ms with 1M keys
 * (test/metrics/gauge-plans.test.ts asserts the plan).
 *
 * Concurrency: a plain MVCC read. It takes no row locks, so it never waits on
 * a worker holding its key FOR UPDATE and blocks nobody; the caller runs it
 * under a statement timeout (gauges.ts).
 */
export const PROCESSING_GAUGES_SQL = `
  select k.tenant, count(*)::float8 as value
    from idempotency_keys k
   where ${cutoffText('stale', 'coalesce($1::timestamptz, now())', '$2::float8')}
   group by k.tenant
  union all
  select null, coalesce(extract(epoch from (coalesce($1::timestamptz, now()) - min(k.locked_at)))::float8, 0)
    from idempotency_keys k
   where k.status = 'processing'`

export function processingGaugeParameters(ttlSeconds: number, now?: Date): [Date | null, number] {
  return [now ?? null, ttlSeconds]
}

export async function readProcessingGauges(sql: Sql, ttlSeconds: number, now?: Date): Promise<ProcessingGauges> {
  const rows = await sql.unsafe<{ tenant: string | null; value: number }[]>(PROCESSING_GAUGES_SQL, processingGaugeParameters(ttlSeconds, now))
  const staleByTenant = new Map<string, number>()
  let oldestAgeSeconds = 0
  for (const row of rows) {
    if (row.tenant === null) oldestAgeSeconds = Math.max(0, row.value) // the clock of a test may run behind a lease
    else staleByTenant.set(row.tenant, row.value)
  }
  return { staleByTenant, oldestAgeSeconds }
}
