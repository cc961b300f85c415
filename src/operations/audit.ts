/** Reading the audit trail: newest first, filtered; one entry. Writes go through core/audit.ts. */
import { ALL_TENANTS, AUDIT_ACTIONS, type AuditAction } from '../core/audit'
import { OperationInputError, type OperationsContext } from './context'
import { isPositiveBigint } from './ids'
import { pageLimit } from './list'

export interface AuditRecord {
  readonly id: string
  readonly at: Date
  readonly actor: string
  readonly action: string
  readonly tenant: string | null
  readonly key: string | null
  readonly outcome: string
  readonly detail: Record<string, unknown> | null
}

export interface AuditFilters {
  /** Actors starting with this: "admin:alice", or "cli:" for every CLI user. */
  readonly actor?: string | undefined
  readonly action?: AuditAction | undefined
  readonly tenant?: string | undefined
  readonly key?: string | undefined
  /** Entries older than this id (keyset: the id only grows). */
  readonly before?: string | undefined
  /** @default 50 */
  readonly limit?: number | undefined
}

export interface RawAuditFilters {
  readonly actor?: string | undefined
  readonly action?: string | undefined
  readonly tenant?: string | undefined
  readonly key?: string | undefined
  readonly before?: string | undefined
}

export const MAX_AUDIT_PAGE = 500
const CONTROL = /[\u0000-\u001f\u007f]/

/** Validates audit filters as typed (blank means none); throws OperationInputError naming the bad one. */
export function parseAuditFilters(raw: RawAuditFilters): AuditFilters {
  const text = (name: string, value: string | undefined, max: number) => {
    const trimmed = value?.trim() || undefined
    if (trimmed !== undefined && (trimmed.length > max || CONTROL.test(trimmed))) throw new OperationInputError(`${name} must be 1 to ${max} printable characters`)
    return trimmed
  }
  const action = raw.action?.trim() || undefined
  if (action !== undefined && !(AUDIT_ACTIONS as readonly string[]).includes(action)) throw new OperationInputError(`action must be one of ${AUDIT_ACTIONS.join(', ')}`)
  const before = raw.before?.trim() || undefined
  if (before !== undefined && !isPositiveBigint(before)) throw new OperationInputError('before must be an audit entry id (1 to 9223372036854775807)')
  return { actor: text('actor', raw.actor, 128), action: action as AuditAction | undefined, tenant: text('tenant', raw.tenant, 64), key: text('key', raw.key, 255), before }
}

export interface AuditPage {
  readonly entries: AuditRecord[]
  /** The `before` of the next (older) page, when there may be one. */
  readonly nextBefore: string | undefined
}

/**
 * Newest first, by keyset on the identity column (its primary key index).
 * With filters it walks that index backwards until it has a page: cheap for
 * the recent entries operators look at; a filter matching nothing reads the
 * whole trail (a few ms per 100k entries).
 */
export async function listAudit(context: OperationsContext, filters: AuditFilters = {}): Promise<AuditPage> {
  const { sql } = context
  const limit = pageLimit(filters.limit, MAX_AUDIT_PAGE)
  const entries = await sql<AuditRecord[]>`
    select id::text, at, actor, action, nullif(tenant, ${ALL_TENANTS}) as tenant, key, outcome, detail
      from idempotency_audit a
     where true
       ${filters.before ? sql`and a.id < ${filters.before}` : sql``}
       ${filters.actor ? sql`and starts_with(a.actor, ${filters.actor})` : sql``}
       ${filters.action ? sql`and a.action = ${filters.action}` : sql``}
       ${filters.tenant ? sql`and a.tenant = ${filters.tenant}` : sql``}
       ${filters.key ? sql`and a.key = ${filters.key}` : sql``}
     order by a.id desc
     limit ${limit}`
  return { entries: [...entries], nextBefore: entries.length === limit ? entries.at(-1)!.id : undefined }
}

/** One entry by id, or undefined. */
export async function auditEntry(context: OperationsContext, id: string): Promise<AuditRecord | undefined> {
  if (!isPositiveBigint(id)) throw new OperationInputError('an audit entry id is a whole number from 1 to 9223372036854775807')
  const [entry] = await context.sql<AuditRecord[]>`
    select id::text, at, actor, action, nullif(tenant, ${ALL_TENANTS}) as tenant, key, outcome, detail from idempotency_audit where id = ${id}`
  return entry
}
