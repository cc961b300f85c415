import type { Fragment } from './policy'
import type { Sql } from './types'

/**
 * The audit trail's one way in. Every operator action writes its entries
 * through `insertAudit` (inside the statement that acts, where the action and
 * its record must commit together: force-expire.ts, expire-stale.ts) or
 * `recordAudit` (one entry after the fact: the manual purge). The trail is
 * append-only; src/operations/audit.ts reads it, and the forced-expirations
 * metric is counted from it (metrics/read-forced-expirations.ts).
 */
export type AuditAction = 'force_expire' | 'expire_all_stale' | 'purge_expired'

export const AUDIT_ACTIONS: readonly AuditAction[] = ['force_expire', 'expire_all_stale', 'purge_expired']

export interface AuditEntry {
  /** "admin:<name>", "api[:<name>]", "cli:<os user or --actor>": who asked. */
  readonly actor: string
  readonly action: AuditAction
  readonly tenant?: string | null | undefined
  readonly key?: string | null | undefined
  readonly outcome: string
  readonly detail?: Record<string, unknown> | undefined
}

/**
 * The tenant of an entry about no single tenant (the manual purge, an
 * expire-stale over every tenant). The table's primary key is (tenant, id),
 * as Citus needs to distribute it by tenant (sql/engine/00011), so no entry
 * has a NULL tenant; the readers (operations/audit.ts) show this one as none.
 */
export const ALL_TENANTS = '*'

/** Longest actor the table accepts (its CHECK); longer names are cut here, never refused. */
export const MAX_ACTOR_LENGTH = 128

/** The actor as stored: the one place it is cut to the column's length. */
export function auditActor(actor: string): string {
  return actor.slice(0, MAX_ACTOR_LENGTH)
}

/**
 * The INSERT of audit rows from `rows`: a SELECT or VALUES yielding, in order,
 * (actor, action, tenant, key, outcome, detail). Pass the actor through
 * auditActor. A plain INSERT: takes no lock anyone else waits on.
 */
export function insertAudit(sql: Sql, rows: Fragment): Fragment {
  return sql`insert into idempotency_audit (actor, action, tenant, key, outcome, detail) ${rows}` as Fragment
}

/** Appends one entry; returns its id. */
export async function recordAudit(sql: Sql, entry: AuditEntry): Promise<string> {
  const [row] = await sql<{ id: string }[]>`
    ${insertAudit(sql, sql`values (${auditActor(entry.actor)}, ${entry.action}, ${entry.tenant ?? ALL_TENANTS}, ${entry.key ?? null},
                                   ${entry.outcome}, ${entry.detail ? sql.json(entry.detail as never) : null})`)}
    returning id`
  return row!.id
}
