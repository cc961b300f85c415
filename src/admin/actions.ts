/**
 * The operator actions as the page and the JSON API run them: the core
 * operation, which writes its own audit entries (the forced-expirations
 * metric is read from that trail, so the CLI's actions count too).
 */
import { expireStale, type ExpireStaleResult } from '../core/expire-stale'
import { forceExpire, type ExpireTarget, type ForceExpireResult } from '../core/force-expire'
import { purgeExpired } from '../core/purge'
import { recordAudit } from '../core/audit'
import type { Sql } from '../core/types'
import type { Metrics } from '../metrics/registry'

export interface ActionContext {
  readonly sql: Sql
  readonly metrics?: Metrics | undefined
  readonly ttlSeconds: number
  readonly retentionSeconds: number
  readonly now?: (() => Date | undefined) | undefined
}

export async function forceExpireAction(context: ActionContext, target: ExpireTarget, actor: string): Promise<ForceExpireResult> {
  const result = await forceExpire(context.sql, target, actor, { ttlSeconds: context.ttlSeconds, now: context.now?.() })
  return result
}

export async function expireStaleAction(context: ActionContext, options: { asOf?: Date | undefined; tenant?: string | undefined }, actor: string): Promise<ExpireStaleResult> {
  const result = await expireStale(context.sql, { ttlSeconds: context.ttlSeconds, asOf: options.asOf ?? context.now?.(), tenant: options.tenant }, actor)
  return result
}

/** Rows per batch and batches per call of an operator-triggered purge (the background job is the usual way). */
const MANUAL_PURGE_BATCH = 500
const MANUAL_PURGE_MAX_BATCHES = 2_000

/** Purges every expired completed key now, batch by batch, and records one audit entry. */
export async function purgeAction(context: ActionContext, actor: string): Promise<{ purged: number; auditId: string }> {
  let purged = 0
  for (let batch = 0; batch < MANUAL_PURGE_MAX_BATCHES; batch++) {
    const deleted = await purgeExpired(context.sql, { retentionSeconds: context.retentionSeconds, batchSize: MANUAL_PURGE_BATCH, now: context.now?.() })
    purged += deleted
    if (deleted > 0) context.metrics?.purgedKeys.inc(deleted)
    if (deleted < MANUAL_PURGE_BATCH) break
  }
  const auditId = await recordAudit(context.sql, { actor, action: 'purge_expired', outcome: 'done', detail: { purged, retention_seconds: context.retentionSeconds } })
  return { purged, auditId }
}
