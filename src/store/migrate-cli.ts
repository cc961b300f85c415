/**
 * `npm run migrate`: applies sql/engine and sql/service to DATABASE_URL, or to the embedded
 * PostgreSQL when unset. Never through PgBouncer, as the service never
 * migrates through it: the runner holds a session advisory lock so that
 * concurrent starts migrate once, and through a transaction pooler the lock
 * and its unlock can land on different server connections, leaving the lock
 * on a pooled connection where the next migration waits for it
 * (store/migrate.ts checkSchema, docs/how-to/pgbouncer.md).
 *
 * `--distribute`: then, on a Citus coordinator whose tables are still local
 * (the database was migrated before citus was added), distributes them
 * online (store/citus.ts distributeOnline, docs/how-to/citus.md).
 *
 * Refused with exit code 2: DATABASE_PGBOUNCER=1 (the operator says so), or a
 * server that refuses a startup parameter PostgreSQL accepts (PgBouncer
 * answers `unsupported startup parameter` unless told to ignore it).
 */
import postgres from 'postgres'
import { ConfigError, loadDatabaseConfig } from '../config'
import { driverConnection, type ConnectionSettings } from './connection-settings'
import { startEmbedded } from './embedded'
import { citusMode, distributeOnline } from './citus'
import { describeVersions, describeWaiting, migrateService } from './migrate'

const out = (line: string) => process.stdout.write(`${line}\n`)
const err = (line: string) => process.stderr.write(`${line}\n`)
const THROUGH_PGBOUNCER = 'Run it against PostgreSQL directly (DATABASE_URL=postgres://<the primary itself> npm run migrate), then start the service behind PgBouncer: it checks the schema and does not migrate (docs/how-to/pgbouncer.md).'

/** The reason `url` looks like PgBouncer, or undefined: PostgreSQL takes any setting as a startup parameter, PgBouncer refuses them. */
async function pgbouncerRefusal(database: ConnectionSettings): Promise<string | undefined> {
  // Where and how as the check above resolved them (TLS included): never the URL read again by the driver.
  const { url, options } = driverConnection(database)
  const probe = postgres(url, { ...(options as object), max: 1, connect_timeout: 5, prepare: false, fetch_types: false, onnotice: () => undefined, connection: { statement_timeout: 60_000 } as never })
  try {
    await probe`select 1`
    return undefined
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error)
    return /unsupported startup parameter/i.test(message) ? message : undefined
  } finally {
    await probe.end({ timeout: 1 })
  }
}

async function main(args: readonly string[]): Promise<number> {
  const distribute = args.includes('--distribute')
  const unknown = args.filter((arg) => arg !== '--distribute')
  if (unknown.length) {
    err(`unknown argument(s): ${unknown.join(' ')} (usage: npm run migrate [-- --distribute])`)
    return 2
  }
  let config: ReturnType<typeof loadDatabaseConfig>
  try {
    config = loadDatabaseConfig()
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error
    err(`configuration error: ${error.message}`)
    return 2
  }
  if (config.databasePgbouncer) {
    err(`refusing to migrate with DATABASE_PGBOUNCER=1: migrations hold a session advisory lock, which a transaction pooler strands. ${THROUGH_PGBOUNCER}`)
    return 2
  }
  if (config.databaseConnection) {
    const refusal = await pgbouncerRefusal(config.databaseConnection).catch(() => undefined) // unreachable: migrate says so below
    if (refusal) {
      err(`refusing to migrate: DATABASE_URL looks like PgBouncer (it answered "${refusal}"), and migrations hold a session advisory lock, which a transaction pooler strands. ${THROUGH_PGBOUNCER}`)
      return 2
    }
  }
  const embedded = config.databaseConnection ? undefined : await startEmbedded({ log: out })
  try {
    const { applied, versions, adopted, pending, ahead } = await migrateService(config.databaseConnection ?? embedded!.url)
    if (adopted) out('the single-line layout of earlier releases (table migrations) was recorded in idempotency_migrations and service_migrations')
    out(`schema at migrations ${describeVersions(versions)} (${applied} applied)`)
    if (ahead) out(`the database is ahead of this release (${describeVersions(ahead)}) by online steps only: nothing to do`)
    // The contract step of an upgrade: run this again once every instance of the older release is stopped (docs/how-to/upgrade.md).
    for (const step of pending ?? [])
      out(`contract step ${step.line} ${step.version} (${step.name}) not applied: ${describeWaiting(step)} do not know ${describeVersions(step.requires)}; run again once they are stopped`)
    const database = config.databaseConnection ?? embedded!.url
    if (distribute) {
      const { tables, functions } = await distributeOnline(database, { log: out })
      out(tables.length || functions.length ? `distributed: ${[...tables, ...functions].join(', ')}` : 'nothing to distribute: every table is distributed already')
    } else if (await modeOf(database) === 'local') {
      out('this database has the citus extension but its tables are local to the coordinator: run `npm run migrate -- --distribute` to distribute them online (docs/how-to/citus.md)')
    }
    return 0
  } catch (error) {
    err(`migration failed: ${error instanceof Error ? error.message : error}`)
    return 1
  } finally {
    await embedded?.stop()
  }
}

async function modeOf(database: string | ConnectionSettings) {
  const { url, options } = driverConnection(database)
  const sql = postgres(url, { ...(options as object), max: 1, connect_timeout: 10, fetch_types: false, onnotice: () => undefined })
  try {
    return await citusMode(sql)
  } finally {
    await sql.end({ timeout: 1 })
  }
}

process.exitCode = await main(process.argv.slice(2))
