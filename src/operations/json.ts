/**
 * The operations' results as JSON, snake_case: the admin JSON API and the
 * CLI's --json print exactly these, so a script can switch between them.
 */
import type { ExpireStalePreview, ExpireStaleResult, ForceExpireResult, PurgePreview, PurgeResult } from './actions'
import type { AuditPage, AuditRecord } from './audit'
import type { KeyCounts } from './count'
import type { KeyPage, ProcessingKey } from './list'
import type { KeyDetail } from './show'
import type { ReleasedCounts, ReleasedKey, ReleasedPage } from './released'

const iso = (date: Date | null): string | null => date?.toISOString() ?? null

export function keyJson(key: ProcessingKey) {
  return {
    tenant: key.tenant,
    key: key.key,
    method: key.method,
    path: key.path,
    lease: key.lease,
    attempts: key.attempts,
    created_at: key.createdAt.toISOString(),
    locked_at: key.lockedAt.toISOString(),
    age_seconds: Math.floor(key.ageSeconds),
    stale: key.stale,
    worked_on: key.workedOn,
  }
}

export function keyPageJson(page: KeyPage) {
  return { data: page.keys.map(keyJson), next_cursor: page.nextCursor ?? null }
}

export function countsJson(counts: KeyCounts, settings: { ttlSeconds: number; retentionSeconds: number }) {
  return {
    processing: counts.processing,
    stale: counts.stale,
    matching: counts.matching,
    oldest_processing_age_seconds: counts.oldestProcessingAgeSeconds,
    expired: counts.expired,
    ...(counts.done === undefined ? {} : { done: counts.done }),
    ttl_seconds: settings.ttlSeconds,
    retention_seconds: settings.retentionSeconds,
  }
}

export function keyDetailJson(detail: KeyDetail) {
  return {
    tenant: detail.tenant,
    key: detail.key,
    status: detail.status,
    method: detail.method,
    path: detail.path,
    fingerprint: detail.fingerprint,
    lease: detail.lease,
    attempts: detail.attempts,
    // request_id stays the execution's id (as released); http_request_id is the id of the request's log lines.
    request_id: detail.requestId,
    http_request_id: detail.httpRequestId,
    downstream_key: detail.downstreamKey,
    created_at: detail.createdAt.toISOString(),
    locked_at: detail.lockedAt.toISOString(),
    completed_at: iso(detail.completedAt),
    released_at: iso(detail.releasedAt),
    release_reason: detail.releaseReason,
    summary: detail.summary,
    age_seconds: Math.floor(detail.ageSeconds),
    stale: detail.stale,
    deadline: iso(detail.deadline),
    retention_ends_at: iso(detail.retentionEndsAt),
    past_retention: detail.pastRetention,
    owner: detail.owner && {
      id: detail.owner.id,
      pid: detail.owner.pid,
      hostname: detail.owner.hostname,
      started_at: iso(detail.owner.startedAt),
      heartbeat_at: iso(detail.owner.heartbeatAt),
      heartbeat_age_seconds: detail.owner.heartbeatAgeSeconds === null ? null : Math.floor(detail.owner.heartbeatAgeSeconds),
      stopped_at: iso(detail.owner.stoppedAt),
      alive: detail.owner.alive,
    },
    force_expire: detail.expirePreview,
    response: detail.response,
    payment: detail.payment && {
      id: detail.payment.id,
      amount: detail.payment.amount,
      currency: detail.payment.currency,
      customer: detail.payment.customer,
      description: detail.payment.description,
      status: detail.payment.status,
      provider_reference: detail.payment.providerReference,
      created_at: detail.payment.createdAt.toISOString(),
    },
  }
}

export function forceExpireJson(result: ForceExpireResult, lease: string) {
  return { outcome: result.outcome, lease, audit_id: result.auditId }
}

export function expireStaleJson(result: ExpireStaleResult) {
  return {
    expired: result.expired,
    worker_alive: result.workerAlive,
    expired_keys: result.expiredKeys,
    worker_alive_keys: result.aliveKeys,
    audit_id: result.auditId,
  }
}

export function expireStalePreviewJson(preview: ExpireStalePreview) {
  return { as_of: preview.asOf.toISOString(), tenant: preview.tenant ?? null, stale: preview.stale, keys: preview.keys.map(keyJson), ttl_seconds: preview.ttlSeconds }
}

export function purgeJson(result: PurgeResult) {
  return { purged: result.purged, audit_id: result.auditId }
}

export function purgePreviewJson(preview: PurgePreview) {
  return { as_of: preview.asOf.toISOString(), done: preview.done, released: preview.released, retention_seconds: preview.retentionSeconds }
}

export function auditJson(entry: AuditRecord) {
  return { id: entry.id, at: entry.at.toISOString(), actor: entry.actor, action: entry.action, tenant: entry.tenant, key: entry.key, outcome: entry.outcome, detail: entry.detail }
}

export function auditPageJson(page: AuditPage) {
  return { data: page.entries.map(auditJson), next_before: page.nextBefore ?? null }
}

export function releasedKeyJson(key: ReleasedKey) {
  return {
    tenant: key.tenant,
    key: key.key,
    method: key.method,
    path: key.path,
    attempts: key.attempts,
    released_at: key.releasedAt.toISOString(),
    reason: key.reason,
    downstream_key: key.downstreamKey,
    summary: key.summary,
    past_retention: key.pastRetention,
  }
}

export function releasedPageJson(page: ReleasedPage, counts: ReleasedCounts) {
  return { data: page.keys.map(releasedKeyJson), next_cursor: page.nextCursor ?? null, counts }
}
