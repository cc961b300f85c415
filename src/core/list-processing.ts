import type { Clock, Sql } from './types'

/** One key in processing, as an operator sees it. */
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
  readonly ageSeconds: number
  /** Older than the TTL: its worker may be gone (or is slow; force-expire tells which). */
  readonly stale: boolean
}

/** Where the previous page ended: keyset pagination, so page 500 costs what page 1 does. */
export interface ProcessingCursor {
  /** locked_at as PostgreSQL text, exact to the microsecond (a JS Date keeps only milliseconds). */
  readonly lockedAt: string
  readonly tenant: string
  readonly key: string
}

export interface ListProcessingOptions extends Clock {
  readonly ttlSeconds: number
  readonly tenant?: string | undefined
  readonly method?: string | undefined
  readonly path?: string | undefined
  readonly staleOnly?: boolean | undefined
  readonly after?: ProcessingCursor | undefined
  /** @default 50 */
  readonly limit?: number | undefined
}

export interface ProcessingPage {
  readonly keys: ProcessingKey[]
  /** Present when more keys follow this page. */
  readonly next: ProcessingCursor | undefined
}

/** A page is for a human or a script; 500 rows is already more than a screen. */
export const MAX_PAGE_SIZE = 500

interface Row {
  tenant: string
  key: string
  method: string
  path: string
  lease: string
  attempts: number
  created_at: Date
  locked_at: Date
  locked_at_text: string
  age_seconds: number
  stale: boolean
}

/**
 * Lists keys in processing, oldest lease first, which puts every stale key
 * (older than the TTL) before the fresh ones.
 *
 * Reads only: takes no row lock, so it never delays a worker or a claim.
 * Order and keyset are (locked_at, tenant, key): unique, so no key is shown
 * twice or skipped across pages while keys come and go. The partial index
 * idempotency_keys_processing (sql/00001) serves exactly this order, so a
 * deep page reads `limit` index entries, never the rows before it.
 */
export async function listProcessing(sql: Sql, options: ListProcessingOptions): Promise<ProcessingPage> {
  const limit = Math.min(Math.max(1, options.limit ?? 50), MAX_PAGE_SIZE)
  const now = options.now ?? null
  const after = options.after
  const rows = await sql<Row[]>`
    with params as (select coalesce(${now}::timestamptz, now()) as now)
    select k.tenant, k.key, k.method, k.path, k.lease, k.attempts, k.created_at, k.locked_at,
           k.locked_at::text as locked_at_text,
           greatest(0, extract(epoch from (p.now - k.locked_at)))::float8 as age_seconds,
           k.locked_at <= p.now - make_interval(secs => ${options.ttlSeconds}) as stale
      from idempotency_keys k, params p
     where k.status = 'processing'
       ${options.tenant ? sql`and k.tenant = ${options.tenant}` : sql``}
       ${options.method ? sql`and k.method = ${options.method}` : sql``}
       ${options.path ? sql`and k.path = ${options.path}` : sql``}
       ${options.staleOnly ? sql`and k.locked_at <= p.now - make_interval(secs => ${options.ttlSeconds})` : sql``}
       ${after ? sql`and (k.locked_at, k.tenant, k.key) > (${after.lockedAt}::timestamptz, ${after.tenant}, ${after.key})` : sql``}
     order by k.locked_at, k.tenant, k.key
     limit ${limit + 1}`
  const page = rows.slice(0, limit)
  const last = page.at(-1)
  return {
    keys: page.map((row) => ({
      tenant: row.tenant,
      key: row.key,
      method: row.method,
      path: row.path,
      lease: row.lease,
      attempts: row.attempts,
      createdAt: row.created_at,
      lockedAt: row.locked_at,
      ageSeconds: row.age_seconds,
      stale: row.stale,
    })),
    next: rows.length > limit && last ? { lockedAt: last.locked_at_text, tenant: last.tenant, key: last.key } : undefined,
  }
}
