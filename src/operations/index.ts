/**
 * What an operator can do, as one library (graphile-worker's WorkerUtils):
 * list, count, show, force-expire, expire-stale, purge, and the audit trail.
 * The admin page, the admin JSON API and the CLI are thin callers of it: they
 * parse their input, call one of these, and render the result.
 */
import { expireStaleKeys, forceExpireKey, previewExpireStale, previewPurge, purgeKeys, type ExpireTarget } from './actions'
import { auditEntry, listAudit, type AuditFilters } from './audit'
import type { OperationsContext } from './context'
import type { Logger } from '../log'
import { countKeys } from './count'
import type { KeyFilters } from './filters'
import { listKeys, type PageRequest } from './list'
import { showKey } from './show'
import { countReleased, listReleased, type ReleasedFilters } from './released'

export type Operations = ReturnType<typeof operations>

function bind(context: OperationsContext) {
  return {
    context,
    ttlSeconds: context.ttlSeconds,
    retentionSeconds: context.retentionSeconds,
    list: (filters: KeyFilters, page?: PageRequest) => listKeys(context, filters, page),
    count: (filters: KeyFilters, options?: { withDone?: boolean }) => countKeys(context, filters, options),
    show: (tenant: string, key: string) => showKey(context, tenant, key),
    listReleased: (filters: ReleasedFilters, page?: PageRequest) => listReleased(context, filters, page),
    countReleased: (tenant?: string) => countReleased(context, tenant),
    forceExpire: (target: ExpireTarget, actor: string) => forceExpireKey(context, target, actor),
    previewExpireStale: (tenant: string | undefined) => previewExpireStale(context, tenant),
    expireStale: (options: { asOf?: Date | undefined; tenant?: string | undefined }, actor: string) => expireStaleKeys(context, options, actor),
    previewPurge: () => previewPurge(context),
    purge: (actor: string) => purgeKeys(context, actor),
    audit: (filters?: AuditFilters) => listAudit(context, filters),
    auditEntry: (id: string) => auditEntry(context, id),
  }
}

export function operations(context: OperationsContext) {
  return {
    ...bind(context),
    /** The same operations, their action lines written to `log` (the admin binds each request's id so). */
    withLog: (log: Logger) => bind({ ...context, log }),
  }
}

export { OperationInputError, type OperationsContext } from './context'
export { parseKeyFilters, filtersQuery, hasFilters, type KeyFilters, type RawKeyFilters } from './filters'
export { parseAuditFilters, type AuditFilters, type AuditRecord } from './audit'
export { MAX_PAGE_SIZE, DEFAULT_PAGE_SIZE, type ProcessingKey } from './list'
export type { KeyCounts } from './count'
export type { KeyDetail, ExpirePreview } from './show'
export type { ExpireStalePreview, PurgePreview, ForceExpireResult, ExpireStaleResult, PurgeResult } from './actions'
export { parseReleaseReason, type ReleasedKey, type ReleasedPage, type ReleasedCounts } from './released'
