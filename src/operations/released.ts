/**
 * Keys released after a failed execution, by reason (core/release.ts):
 * above all the ones released after their deadline. Such a request was
 * stopped while its provider call was in flight, and the provider may still
 * have charged (seen: a 504 at 9 s, the charge recorded 60 s later). Nothing
 * shows that charge until the client retries with the same key (the retry
 * sends the same downstream key and gets that charge back). An operator who
 * wants to know sooner asks the provider with the downstream key listed here.
 *
 * A key leaves this list when a retry takes it again (it is processing or
 * done then) or when the retention purge deletes it.
 */
import { downstreamKey } from '../core/downstream-key'
import { RELEASE_REASONS, type ReleaseReason } from '../core/release'
import { releasedExpired } from '../core/policy'
import { OperationInputError, type OperationsContext } from './context'
import { decodeCursor, encodeCursor } from './cursor'
import { pageLimit, type PageRequest } from './list'

export interface ReleasedKey {
  readonly tenant: string
  readonly key: string
  readonly method: string
  readonly path: string
  readonly attempts: number
  readonly releasedAt: Date
  readonly reason: ReleaseReason | null
  /** What to ask the provider with: the Idempotency-Key the request sent it, the same on its retry. */
  readonly downstreamKey: string
  /** The route's summary stored at claim (payments: customer, amount, currency), if it had one. */
  readonly summary: Readonly<Record<string, unknown>> | null
  /** Released longer ago than the retention: the purge deletes it, and a retry is a new request. */
  readonly pastRetention: boolean
}

export interface ReleasedPage {
  readonly keys: ReleasedKey[]
  readonly nextCursor: string | undefined
}

export interface ReleasedFilters {
  readonly reason: ReleaseReason
  readonly tenant?: string | undefined
}

export function parseReleaseReason(raw: string | undefined): ReleaseReason {
  const reason = raw?.trim() || 'deadline'
  if (!(RELEASE_REASONS as readonly string[]).includes(reason)) throw new OperationInputError(`reason must be one of ${RELEASE_REASONS.join(', ')}`)
  return reason as ReleaseReason
}

interface Row {
  tenant: string
  key: string
  method: string
  path: string
  attempts: number
  request_id: string
  released_at: Date
  released_at_text: string
  release_reason: ReleaseReason | null
  summary: Record<string, unknown> | null
  past_retention: boolean
}

/**
 * Released keys of one reason, newest release first. Reads only: a range
 * of idempotency_keys_released (sql/engine/00005: only released keys have a
 * reason), keyset on (released_at, tenant, key), unique, so pages neither
 * repeat nor skip a key.
 */
export async function listReleased(context: OperationsContext, filters: ReleasedFilters, page: PageRequest = {}): Promise<ReleasedPage> {
  const { sql } = context
  const limit = pageLimit(page.limit)
  const after = page.cursor ? await decodeCursor(sql, 'released', page.cursor) : undefined
  const now = context.now?.() ?? null
  // The cursor's instant goes as text (::text first): as a timestamptz parameter postgres.js makes a JS Date of it,
  // which drops the microseconds (the last key of a page came again at the top of the next one).
  const rows = await sql<Row[]>`
    select k.tenant, k.key, k.method, k.path, k.attempts, k.request_id::text as request_id,
           k.released_at, k.released_at::text as released_at_text, k.release_reason, k.summary,
           ${releasedExpired(sql, now, context.retentionSeconds)} as past_retention
      from idempotency_keys k
     where k.release_reason = ${filters.reason} and k.status = 'released'
       ${filters.tenant ? sql`and k.tenant = ${filters.tenant}` : sql``}
       ${after ? sql`and (k.released_at, k.tenant, k.key) < (${after.at}::text::timestamptz, ${after.tenant}, ${after.key})` : sql``}
     order by k.released_at desc, k.tenant desc, k.key desc
     limit ${limit + 1}`
  const shown = rows.slice(0, limit)
  const last = shown.at(-1)
  return {
    keys: shown.map((row) => ({
      tenant: row.tenant,
      key: row.key,
      method: row.method,
      path: row.path,
      attempts: row.attempts,
      releasedAt: row.released_at,
      reason: row.release_reason,
      downstreamKey: downstreamKey({ tenant: row.tenant, key: row.key, requestId: row.request_id }),
      summary: row.summary,
      pastRetention: row.past_retention,
    })),
    nextCursor: rows.length > limit && last ? await encodeCursor(sql, 'released', { at: last.released_at_text, tenant: last.tenant, key: last.key }) : undefined,
  }
}

export type ReleasedCounts = Readonly<Record<ReleaseReason, number>>

/** Released keys now, by reason; one pass over idempotency_keys_released. */
export async function countReleased(context: OperationsContext, tenant?: string): Promise<ReleasedCounts> {
  const { sql } = context
  const rows = await sql<{ reason: ReleaseReason | null; count: number }[]>`
    select k.release_reason as reason, count(*)::int as count
      from idempotency_keys k
     where k.release_reason is not null and k.status = 'released' ${tenant ? sql`and k.tenant = ${tenant}` : sql``}
     group by k.release_reason`
  const counts: Record<string, number> = Object.fromEntries(RELEASE_REASONS.map((reason) => [reason, 0]))
  for (const row of rows) if (row.reason) counts[row.reason] = row.count
  return counts as ReleasedCounts
}
