import type postgres from 'postgres'

/** PostgreSQL's own thresholds, where a table does not set its own. */
const DEFAULTS = { autovacuum_vacuum_threshold: 50, autovacuum_vacuum_insert_threshold: 1000, autovacuum_analyze_threshold: 50 }

/** The tables the request path reads and writes per key, in either form (sql/engine/00020 added the answers). */
export const KEY_TABLES = ['idempotency_keys', 'idempotency_processing', 'idempotency_answers'] as const
export type KeyTable = (typeof KEY_TABLES)[number]

/**
 * How many payments (for idempotency_keys and idempotency_answers) or entries
 * come and gone (for idempotency_processing) a table has been through, at the
 * least, when autovacuum first looks at it, and so first writes its
 * statistics (sql/engine/00006, 00018): past its vacuum threshold (dead rows),
 * its insert threshold or its analyze threshold (changes), whichever comes
 * first. What a payment leaves in each:
 *
 * - a key of the old form: an insert and a completion's update, so one dead
 *   row and two changes; of the new form (`apart`): an insert only;
 * - an answer (new form only): an insert;
 * - an entry of the list: an insert and a delete, so one dead row and two changes.
 */
export async function firstLooks(sql: postgres.Sql, apart = false): Promise<Record<KeyTable, number>> {
  const rows = await sql<{ relname: string; options: string[] | null }[]>`
    select relname, reloptions as options from pg_class where relname in ${sql(KEY_TABLES)}`
  const first = (table: KeyTable, { dead, changes }: { dead: boolean; changes: number }) => {
    const options = rows.find((row) => row.relname === table)?.options ?? []
    const option = (name: keyof typeof DEFAULTS) => Number(options.find((o) => o.startsWith(`${name}=`))?.split('=')[1] ?? DEFAULTS[name])
    return Math.min(...(dead ? [option('autovacuum_vacuum_threshold')] : []), option('autovacuum_vacuum_insert_threshold'), option('autovacuum_analyze_threshold') / changes)
  }
  return {
    idempotency_keys: apart ? first('idempotency_keys', { dead: false, changes: 1 }) : first('idempotency_keys', { dead: true, changes: 2 }),
    idempotency_processing: first('idempotency_processing', { dead: true, changes: 2 }),
    idempotency_answers: first('idempotency_answers', { dead: false, changes: 1 }),
  }
}
