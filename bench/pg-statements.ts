import type postgres from 'postgres'

/**
 * The PostgreSQL side of a profile: contrib pg_stat_statements, per statement
 * of the bench's database, its calls, time and WAL. It must be in the
 * server's shared_preload_libraries (a restart); when it is not, the bench
 * says so and goes on. The bench's own embedded cluster loads it
 * (bench/server.ts) unless BENCH_PG_STAT_STATEMENTS=0.
 */
export interface StatementRow {
  query: string
  calls: number
  meanMs: number
  totalMs: number
  /** Share of the listed statements' total execution time, in %. */
  percent: number
  rowsPerCall: number
  walBytesPerCall: number
  blocksPerCall: number
}

export type StatementStats = { ok: true; statements: StatementRow[] } | { ok: false; note: string }

/** Whether pg_stat_statements is loaded; if so, makes the extension in this database and zeroes its counters. */
export async function resetStatements(sql: postgres.Sql): Promise<{ ok: true } | { ok: false; note: string }> {
  const [row] = await sql<{ loaded: boolean }[]>`select current_setting('shared_preload_libraries') ~ 'pg_stat_statements' as loaded`
  if (!row?.loaded)
    return { ok: false, note: 'pg_stat_statements is not in this server\'s shared_preload_libraries (the bench\'s own embedded cluster loads it unless BENCH_PG_STAT_STATEMENTS=0)' }
  try {
    await sql`create extension if not exists pg_stat_statements`
    await sql`select pg_stat_statements_reset(0, d.oid, 0) from pg_database d where d.datname = current_database()`
  } catch (error) {
    return { ok: false, note: `pg_stat_statements: ${error instanceof Error ? error.message : String(error)}` }
  }
  return { ok: true }
}

/** The `limit` statements of this database that took the most execution time since the reset; the bench's own catalog reads left out. */
export async function readStatements(sql: postgres.Sql, limit = 12): Promise<StatementRow[]> {
  const rows = await sql<{ query: string; calls: string; total: number; mean: number; rows: string; wal: string; blocks: string }[]>`
    select s.query, s.calls, s.total_exec_time as total, s.mean_exec_time as mean, s.rows, s.wal_bytes as wal,
           s.shared_blks_hit + s.shared_blks_read as blocks
      from pg_stat_statements s join pg_database d on d.oid = s.dbid
     where d.datname = current_database() and s.query !~* '(pg_stat_|pg_database|pg_backend_pid|pg_settings)'
     order by s.total_exec_time desc
     limit ${limit}`
  const total = rows.reduce((sum, r) => sum + r.total, 0)
  const round = (x: number, digits = 2) => Math.round(x * 10 ** digits) / 10 ** digits
  return rows.map((r) => {
    const calls = Number(r.calls)
    return {
      query: r.query.replace(/\s+/g, ' ').trim(),
      calls,
      meanMs: round(r.mean, 3),
      totalMs: round(r.total, 0),
      percent: round((r.total / total) * 100, 1),
      rowsPerCall: round(Number(r.rows) / calls),
      walBytesPerCall: round(Number(r.wal) / calls, 0),
      blocksPerCall: round(Number(r.blocks) / calls, 1),
    }
  })
}
