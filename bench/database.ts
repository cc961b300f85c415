import postgres from 'postgres'
import { startEmbedded, type EmbeddedPostgres } from '../src/store/embedded'
import { migrate } from '../src/store/migrate'

/** Port of the bench's own embedded PostgreSQL (tests use 54339, `npm start` 54329). */
const BENCH_EMBEDDED_PORT = 54349

export interface BenchDatabase {
  /** URL of the fresh, migrated database of this run. */
  readonly url: string
  /** Server version, e.g. "15.20". */
  readonly version: string
  drop(): Promise<void>
}

/**
 * A fresh database for one bench run: on DATABASE_URL's server when set, else
 * on an embedded PostgreSQL under .data/bench-pg. Dropped at the end.
 */
export async function freshDatabase(log: (line: string) => void): Promise<BenchDatabase> {
  let embedded: EmbeddedPostgres | undefined
  let base = process.env.DATABASE_URL
  if (!base) {
    embedded = await startEmbedded({ dir: '.data/bench-pg', port: BENCH_EMBEDDED_PORT, log })
    if (process.env.BENCH_PG_STAT_STATEMENTS === '1') embedded = await withStatementStats(embedded, log)
    base = embedded.url
  }
  const name = `idem_bench_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  const [row] = await admin<{ version: string }[]>`select current_setting('server_version') as version`
  const version = row?.version ?? 'unknown'
  await admin.end()
  const url = new URL(base)
  url.pathname = `/${name}`
  await migrate(url.toString())
  return {
    url: url.toString(),
    version,
    async drop() {
      const cleanup = postgres(base, { max: 1, onnotice: () => undefined })
      await cleanup.unsafe(`drop database if exists "${name}" with (force)`)
      await cleanup.end()
      await embedded?.stop()
    },
  }
}

/**
 * BENCH_PG_STAT_STATEMENTS=1: the bench's own embedded server with contrib
 * pg_stat_statements loaded (bench/pg-statements.ts reads it). Loading it
 * takes a restart, so it is set once with ALTER SYSTEM (kept in that data
 * directory for later runs) and the server restarted. Never done to a server
 * given in DATABASE_URL: that one is not ours to restart.
 */
async function withStatementStats(embedded: EmbeddedPostgres, log: (line: string) => void): Promise<EmbeddedPostgres> {
  const sql = postgres(embedded.url, { max: 1, onnotice: () => undefined })
  try {
    const [row] = await sql<{ libraries: string }[]>`select current_setting('shared_preload_libraries') as libraries`
    const libraries = row?.libraries.trim() ?? ''
    if (/pg_stat_statements/.test(libraries)) return embedded
    const value = libraries ? `${libraries}, pg_stat_statements` : 'pg_stat_statements'
    // ALTER SYSTEM takes a literal, not a parameter; the value comes from the server's own setting.
    await sql.unsafe(`alter system set shared_preload_libraries = '${value.replaceAll("'", "''")}'`)
  } finally {
    await sql.end()
  }
  log('restarting the embedded PostgreSQL with pg_stat_statements loaded')
  await embedded.stop()
  return startEmbedded({ dir: '.data/bench-pg', port: BENCH_EMBEDDED_PORT, log })
}
