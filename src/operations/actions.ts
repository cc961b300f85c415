/**
 * What operators change, each recording its audit entry in one place: the
 * statement that acts (force-expire, expire-stale: the action and its record
 * commit together) or one entry after it (purge). The forced-expirations
 * metric is read from that trail, so the page, the JSON API and the CLI all
 * count (metrics/forced-expirations.ts).
 */
import { recordAudit } from '../core/audit'
import { expireStale, type ExpireStaleResult } from '../core/expire-stale'
import { forceExpire, type ExpireTarget, type ForceExpireResult } from '../core/force-expire'
import { answeredExpired, expired, releasedExpired, stale, staleEntry } from '../core/policy'
import { readKeptRetentionSeconds } from '../core/processes'
import { purgeExpired } from '../core/purge'
import { OperationInputError, type OperationsContext } from './context'
import { log as processLog } from '../log'
import type { KeyFilters } from './filters'
import { listKeys, type ProcessingKey } from './list'
import { KEY_STATES } from '../core/key-states'

export type { ExpireStaleResult, ExpireTarget, ForceExpireResult }

/** The one line an operator action writes (its audit entry is the record; this is for the log pipeline). */
function logAction(context: OperationsContext, action: string, fields: Record<string, unknown>): void {
  (context.log ?? processLog).info(`operator action: ${action}`, { action, ...fields })
}

/** Force-expires one processing key, conditional on the lease the operator saw (core/force-expire.ts). */
export async function forceExpireKey(context: OperationsContext, target: ExpireTarget, actor: string): Promise<ForceExpireResult> {
  const result = await forceExpire(context.sql, target, actor, { now: context.now?.() })
  logAction(context, 'force_expire', { actor, tenant: target.tenant, key: target.key, lease: target.lease, outcome: result.outcome, audit_id: result.auditId })
  return result
}

/** Keys the confirmation of an expire-all-stale names one by one; the rest are counted. */
export const PREVIEW_LISTED = 20

export interface ExpireStalePreview {
  /** The instant the count was taken: confirming expires only keys already stale then. */
  readonly asOf: Date
  readonly tenant: string | undefined
  readonly stale: number
  /** The oldest of them, up to PREVIEW_LISTED. */
  readonly keys: readonly ProcessingKey[]
  readonly ttlSeconds: number
}

/** What an expire-all-stale would do now: for the confirmation step. Reads only. */
export async function previewExpireStale(context: OperationsContext, tenant: string | undefined): Promise<ExpireStalePreview> {
  const { sql } = context
  // One aggregate over the list and its keys, the instant beside it: no CTE for the instant, whose correlated
  // subquery Citus refuses ("correlated subqueries are not supported when the FROM clause contains a CTE").
  const at = sql`coalesce(${context.now?.() ?? null}::timestamptz, now())`
  const [row] = await sql<{ as_of: Date; stale: number }[]>`
    select ${at} as as_of, count(*)::int as stale
      from idempotency_processing pr
      join ${sql.unsafe(KEY_STATES)} k on k.tenant = pr.tenant and k.key = pr.key
     where ${staleEntry(sql, at)} and ${stale(sql, at)} ${tenant ? sql`and k.tenant = ${tenant}` : sql``}`
  const asOf = row!.as_of
  const filters: KeyFilters = { tenant, staleOnly: true }
  const page = await listKeys({ ...context, now: () => asOf }, filters, { limit: PREVIEW_LISTED })
  return { asOf, tenant, stale: row!.stale, keys: page.keys, ttlSeconds: context.ttlSeconds }
}

/**
 * An instant PostgreSQL takes as the driver writes it: a JS Date past the year
 * 9999 is written `+275760-...`, which PostgreSQL refuses (22009) where a year 0
 * is refused as out of range: both the request's mistake, never a 500.
 */
function isInstant(date: Date): boolean {
  const year = date.getUTCFullYear()
  return Number.isFinite(date.getTime()) && year >= 1 && year <= 9999
}

/** Expires every key stale at `asOf` (default now), skipping live workers' (core/expire-stale.ts). */
export async function expireStaleKeys(context: OperationsContext, options: { asOf?: Date | undefined; tenant?: string | undefined }, actor: string): Promise<ExpireStaleResult> {
  if (options.asOf !== undefined && !isInstant(options.asOf)) throw new OperationInputError('as_of must be an instant between the years 1 and 9999')
  const result = await expireStale(context.sql, { asOf: options.asOf ?? context.now?.(), tenant: options.tenant }, actor)
  logAction(context, 'expire_all_stale', { actor, tenant: options.tenant, expired: result.expired, worker_alive: result.workerAlive, audit_id: result.auditId })
  return result
}

export interface PurgePreview {
  readonly asOf: Date
  /** Completed keys past retention: no longer replayed, a claim already treats them as new. */
  readonly done: number
  /** Released keys past retention (counted from their release). */
  readonly released: number
  readonly retentionSeconds: number
}

/** What a purge would delete now: for the confirmation step. Reads only (two index ranges). */
export async function previewPurge(context: OperationsContext): Promise<PurgePreview> {
  const { sql } = context
  const now = context.now?.() ?? null
  const retentionSeconds = await readKeptRetentionSeconds(sql, context.retentionSeconds)
  const [row] = await sql<{ as_of: Date; done: number; released: number }[]>`
    select coalesce(${now}::timestamptz, now()) as as_of,
           (select count(*)::int from idempotency_keys k
             where ${expired(sql, now, retentionSeconds)} or ${answeredExpired(sql, now, retentionSeconds)}) as done,
           (select count(*)::int from idempotency_keys k where ${releasedExpired(sql, now, retentionSeconds)}) as released`
  return { asOf: row!.as_of, done: row!.done, released: row!.released, retentionSeconds }
}

/** Rows per batch and batches per call of an operator-triggered purge (the background job is the usual way). */
const MANUAL_PURGE_BATCH = 500
const MANUAL_PURGE_MAX_BATCHES = 2_000

export interface PurgeResult {
  readonly purged: number
  readonly auditId: string
}

/**
 * Purges every key past the server's retention now, batch by batch
 * (core/purge.ts), and records one audit entry. Nothing the service would
 * still replay is deleted: the retention is the server's (or a live
 * process's, if longer: core/processes.ts keptRetentionSeconds), never the caller's.
 */
export async function purgeKeys(context: OperationsContext, actor: string): Promise<PurgeResult> {
  let purged = 0
  const retentionSeconds = await readKeptRetentionSeconds(context.sql, context.retentionSeconds)
  for (let batch = 0; batch < MANUAL_PURGE_MAX_BATCHES; batch++) {
    const deleted = await purgeExpired(context.sql, { retentionSeconds, batchSize: MANUAL_PURGE_BATCH, now: context.now?.() })
    purged += deleted
    if (deleted > 0) context.purgedKeys?.inc(deleted)
    if (deleted < MANUAL_PURGE_BATCH) break
  }
  const auditId = await recordAudit(context.sql, { actor, action: 'purge_expired', outcome: 'done', detail: { purged, retention_seconds: retentionSeconds } })
  logAction(context, 'purge_expired', { actor, purged, audit_id: auditId })
  return { purged, auditId }
}
