import { readdirSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import shift from 'postgres-shift'

export const MIGRATIONS_DIR = join(import.meta.dir, '..', '..', 'sql')

/** Any fixed number; it only has to be the same in every process of this product. */
const MIGRATION_LOCK_ID = 7_246_013_917

/**
 * Applies the numbered migrations in sql/ (postgres-shift: porsager's runner
 * for postgres.js, forward-only, each run in one transaction).
 *
 * postgres-shift alone would race when several processes start at once, so we
 * hold a session advisory lock on a single-connection client for the whole
 * run: the others wait, then find nothing left to do. A database migrated by a
 * newer release (more migrations than we know) is refused rather than run
 * against a schema we don't understand.
 */
export async function migrate(url: string, dir = MIGRATIONS_DIR): Promise<{ applied: number; version: number }> {
  const known = readdirSync(dir).filter((file) => /^\d{5}_.*\.sql$/.test(file)).length
  const sql = postgres(url, { max: 1, fetch_types: false, onnotice: () => undefined, connect_timeout: 10 })
  try {
    await sql`select pg_advisory_lock(${MIGRATION_LOCK_ID})`
    const before = await currentVersion(sql)
    if (before > known)
      throw new Error(`the database schema is at migration ${before}, newer than this release knows (${known}); upgrade the service`)
    await shift({ sql, path: dir })
    const after = await currentVersion(sql)
    return { applied: after - before, version: after }
  } finally {
    await sql`select pg_advisory_unlock(${MIGRATION_LOCK_ID})`.catch(() => undefined)
    await sql.end({ timeout: 5 })
  }
}

async function currentVersion(sql: postgres.Sql): Promise<number> {
  const [row] = await sql<{ version: number | null }[]>`
    select case when to_regclass('migrations') is null then 0 end as version`
  if (row?.version === 0) return 0
  const [latest] = await sql<{ version: number }[]>`select coalesce(max(migration_id), 0)::int as version from migrations`
  return latest?.version ?? 0
}

/**
 * Behind PgBouncer in transaction mode the session advisory lock above would
 * be taken on one server connection and released on another, or never: the
 * next start would wait forever. So the service does not migrate there; it
 * only checks that someone did (`npm run migrate` with a direct DATABASE_URL),
 * and refuses to run on a schema other than the one it knows.
 */
export async function checkSchema(url: string, options: { prepare?: boolean } = {}, dir = MIGRATIONS_DIR): Promise<number> {
  const known = readdirSync(dir).filter((file) => /^\d{5}_.*\.sql$/.test(file)).length
  const sql = postgres(url, { max: 1, fetch_types: false, onnotice: () => undefined, connect_timeout: 10, prepare: options.prepare ?? true })
  try {
    const version = await currentVersion(sql)
    if (version < known)
      throw new Error(`the database schema is at migration ${version}, this release needs ${known}: run \`npm run migrate\` with DATABASE_URL pointing at PostgreSQL directly (not through PgBouncer)`)
    if (version > known)
      throw new Error(`the database schema is at migration ${version}, newer than this release knows (${known}); upgrade the service`)
    return version
  } finally {
    await sql.end({ timeout: 5 })
  }
}
