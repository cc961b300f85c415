import type postgres from 'postgres'

/** PostgreSQL's own thresholds, where a table does not set its own. */
const DEFAULTS = { autovacuum_vacuum_threshold: 50, autovacuum_vacuum_insert_threshold: 1000, autovacuum_analyze_threshold: 50 }

/**
 * How many payments (for idempotency_keys) or entries come and gone (for
 * idempotency_processing) a table has been through, at the least, when
 * autovacuum first looks at it: each leaves one dead row and one insert to
 * vacuum's thresholds and two changes to analyze's (a key's insert and its
 * completion, an entry's insert and its delete), and the table's statistics
 * are first written by whichever comes first (sql/engine/00006, 00018).
 */
export async function firstLooks(sql: postgres.Sql): Promise<{ keys: number; list: number }> {
  const rows = await sql<{ relname: string; options: string[] | null }[]>`
    select relname, reloptions as options from pg_class where relname in ('idempotency_keys', 'idempotency_processing')`
  const first = (table: string) => {
    const options = rows.find((row) => row.relname === table)?.options ?? []
    const option = (name: keyof typeof DEFAULTS) => Number(options.find((o) => o.startsWith(`${name}=`))?.split('=')[1] ?? DEFAULTS[name])
    return Math.min(option('autovacuum_vacuum_threshold'), option('autovacuum_vacuum_insert_threshold'), option('autovacuum_analyze_threshold') / 2)
  }
  return { keys: first('idempotency_keys'), list: first('idempotency_processing') }
}
