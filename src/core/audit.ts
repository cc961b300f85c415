import type { Sql } from './types'

/** What operators did; the audit trail is append-only. */
export type AuditAction = 'force_expire' | 'expire_all_stale' | 'purge_expired'

export interface AuditEntry {
  /** "admin:<session>", "api", "cli:<os user>": who asked. */
  readonly actor: string
  readonly action: AuditAction
  readonly tenant?: string | null | undefined
  readonly key?: string | null | undefined
  readonly outcome: string
  readonly detail?: Record<string, unknown> | undefined
}

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

/** Longest actor the table accepts (its CHECK); longer names are cut, never refused. */
const MAX_ACTOR_LENGTH = 128

/** Appends one entry. A plain INSERT: takes no lock anyone else waits on. */
export async function recordAudit(sql: Sql, entry: AuditEntry): Promise<string> {
  const [row] = await sql<{ id: string }[]>`
    insert into idempotency_audit (actor, action, tenant, key, outcome, detail)
    values (${entry.actor.slice(0, MAX_ACTOR_LENGTH)}, ${entry.action}, ${entry.tenant ?? null}, ${entry.key ?? null},
            ${entry.outcome}, ${entry.detail ? sql.json(entry.detail as never) : null})
    returning id`
  return row!.id
}

export interface ListAuditOptions {
  /** Entries older than this id (keyset: the id only grows). */
  readonly before?: string | undefined
  /** Only this one entry (the result of an action just taken). */
  readonly id?: string | undefined
  /** @default 20 */
  readonly limit?: number | undefined
}

/** Newest first, by keyset on the identity column (its primary key index). Reads only. */
export async function listAudit(sql: Sql, options: ListAuditOptions = {}): Promise<AuditRecord[]> {
  const limit = Math.min(Math.max(1, options.limit ?? 20), 500)
  return sql<AuditRecord[]>`
    select id, at, actor, action, tenant, key, outcome, detail
      from idempotency_audit
     where true
       ${options.before ? sql`and id < ${options.before}` : sql``}
       ${options.id ? sql`and id = ${options.id}` : sql``}
     order by id desc
     limit ${limit}`
}
