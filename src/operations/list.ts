import { stale, staleEntry, workedOnCondition } from '../core/policy'
import { OperationInputError, type OperationsContext } from './context'
import { decodeCursor, encodeCursor } from './cursor'
import { filterConditions, type KeyFilters } from './filters'
import { KEY_STATES } from '../core/key-states'

/** One key in processing, as an operator sees it in the list. */
export interface ProcessingKey {
  readonly tenant: string
  readonly key: string
  readonly method: string
  readonly path: string
  /** The lease the operator saw: a force-expire acts only if it is still this one. */
  readonly lease: string
  readonly attempts: number
  readonly createdAt: Date
  readonly lockedAt: Date
  /** Its deadline: past it, the key is stale. */
  readonly staleAt: Date
  readonly ageSeconds: number
  /** Past its deadline (policy.ts): its worker has stopped. */
  readonly stale: boolean
  /**
   * A live request works on it (its owner's heartbeat lists its lease,
   * policy.ts workedOn): false for a key whose process is gone or whose
   * claim's answer was lost, which a retry or an operator may take over now.
   */
  readonly workedOn: boolean
}

export interface KeyPage {
  readonly keys: ProcessingKey[]
  /** An opaque cursor for the next page, when more keys follow. */
  readonly nextCursor: string | undefined
}

/** A page is for a human or a script; 500 rows is already more than a screen. */
export const MAX_PAGE_SIZE = 500
export const DEFAULT_PAGE_SIZE = 50

/** The page size asked for, or `fallback`; anything but a whole number from 1 to `max` is the caller's mistake. */
export function pageLimit(limit: number | undefined, max = MAX_PAGE_SIZE, fallback = DEFAULT_PAGE_SIZE): number {
  const value = limit ?? fallback
  if (!Number.isInteger(value) || value < 1 || value > max) throw new OperationInputError(`limit must be a whole number from 1 to ${max}`)
  return value
}

export interface PageRequest {
  /** A cursor from the previous page's nextCursor. */
  readonly cursor?: string | undefined
  /** @default DEFAULT_PAGE_SIZE */
  readonly limit?: number | undefined
}

interface Row {
  tenant: string
  key: string
  method: string
  path: string
  lease: string
  attempts: number
  created_at: Date
  locked_at: Date
  stale_at: Date
  stale_at_text: string
  age_seconds: number
  stale: boolean
  worked_on: boolean
}

/**
 * Lists keys in processing, earliest deadline first, which puts every stale
 * key before the fresh ones.
 *
 * Reads only: takes no row lock, so it never delays a worker or a claim.
 * Order and keyset are (stale_at, tenant, key): unique, so no key is shown
 * twice or skipped across pages while keys come and go. It is the primary key
 * of idempotency_processing (sql/engine/00005), which holds exactly the keys in
 * processing, so a deep page reads `limit` entries, never the rows before it,
 * and completed keys are never read at all.
 */
export async function listKeys(context: OperationsContext, filters: KeyFilters, page: PageRequest = {}): Promise<KeyPage> {
  const { sql } = context
  const limit = pageLimit(page.limit)
  const after = page.cursor ? await decodeCursor(sql, 'keys', page.cursor) : undefined
  const now = context.now?.() ?? null
  // The cursor's instant goes as text (::text first): as a timestamptz parameter postgres.js makes a JS Date of it,
  // which drops the microseconds (the last key of a page came again at the top of the next one).
  const rows = await sql<Row[]>`
    with params as (select coalesce(${now}::timestamptz, now()) as now)
    select k.tenant, k.key, k.method, k.path, k.lease, k.attempts, k.created_at, k.locked_at, pr.stale_at,
           pr.stale_at::text as stale_at_text,
           greatest(0, extract(epoch from (p.now - k.locked_at)))::float8 as age_seconds,
           ${stale(sql, sql`p.now`)} as stale,
           ${workedOnCondition(sql, now)} as worked_on
      from idempotency_processing pr
      join ${sql.unsafe(KEY_STATES)} k on k.tenant = pr.tenant and k.key = pr.key, params p
     where k.status = 'processing'
       ${filterConditions(sql, filters)}
       ${filters.staleOnly ? sql`and ${staleEntry(sql, sql`p.now`)} and ${stale(sql, sql`p.now`)}` : sql``}
       ${after ? sql`and (pr.stale_at, pr.tenant, pr.key) > (${after.at}::text::timestamptz, ${after.tenant}, ${after.key})` : sql``}
     order by pr.stale_at, pr.tenant, pr.key
     limit ${limit + 1}`
  const shown = rows.slice(0, limit)
  const last = shown.at(-1)
  return {
    keys: shown.map((row) => ({
      tenant: row.tenant,
      key: row.key,
      method: row.method,
      path: row.path,
      lease: row.lease,
      attempts: row.attempts,
      createdAt: row.created_at,
      lockedAt: row.locked_at,
      staleAt: row.stale_at,
      ageSeconds: row.age_seconds,
      stale: row.stale,
      workedOn: row.worked_on,
    })),
    nextCursor: rows.length > limit && last ? await encodeCursor(sql, 'keys', { at: last.stale_at_text, tenant: last.tenant, key: last.key }) : undefined,
  }
}
