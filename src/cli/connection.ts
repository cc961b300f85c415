/** Where the CLI's database is, and the operations it runs there with the server's own settings. */
import { ConfigError, DEFAULT_EMBEDDED_DIR, loadDatabaseConfig } from '../config'
import { readServerSettings } from '../core/settings'
import type { Sql } from '../core/types'
import { createLogger } from '../log'
import { operations, type Operations } from '../operations'
import { operatorSettings, type GivenSettings, type OperatorSettings } from '../operations/context'
import type { ConnectionSettings } from '../store/connection-settings'
import { openPools } from '../store/db'
import { embeddedDataDir, findRunningEmbedded } from '../store/embedded'
import { UsageError, type CliIo } from './io'

/**
 * The TTL and retention the server runs with, as it recorded them at start,
 * else (an app on the plugin records none) as the operator gave them
 * (operations/context.ts). Never the operator's shell: `IDEMPOTENCY_RETENTION_SECONDS=1
 * idem purge` once deleted keys the service still replays, and the next retry paid twice.
 */
async function serverSettings(sql: Sql, io: CliIo, given: GivenSettings): Promise<OperatorSettings> {
  const settings = operatorSettings(await readServerSettings(sql), given)
  if (settings.source === 'recorded') {
    for (const [name, value] of [['IDEMPOTENCY_TTL_SECONDS', settings.ttlSeconds], ['IDEMPOTENCY_RETENTION_SECONDS', settings.retentionSeconds]] as const) {
      const mine = io.env[name]
      if (mine && mine.trim() !== String(value)) io.err(`idem: ignoring ${name}=${mine} from this shell: the server runs with ${value}\n`)
    }
  }
  return settings
}

/**
 * The database: DATABASE_URL, else the embedded PostgreSQL `npm start` runs
 * for this checkout (the same EMBEDDED_PG_DIR rules, its port from its lock
 * file), else a usage error saying what to do. Never starts one: a server
 * started here would be stopped under a service that adopted it meanwhile.
 */
function databaseOf(io: CliIo): { database: string | ConnectionSettings; pgbouncer: boolean } {
  let config: ReturnType<typeof loadDatabaseConfig>
  try {
    config = loadDatabaseConfig(io.env)
  } catch (error) {
    if (error instanceof ConfigError) throw new UsageError(error.message)
    throw error
  }
  // Resolved with this command's environment, as REQUIRE_TLS judged it: the driver reads nothing again (store/connection-settings.ts).
  if (config.databaseConnection) return { database: config.databaseConnection, pgbouncer: config.databasePgbouncer }
  const where = { dir: config.embeddedDir, relocate: config.embeddedDir === DEFAULT_EMBEDDED_DIR }
  const embedded = findRunningEmbedded(where)
  if (!embedded)
    // Where the data is, not where it would be by default: as root in a private checkout it lives under /var/lib.
    throw new UsageError(`DATABASE_URL is not set, and no embedded PostgreSQL of this checkout is running (data in ${embeddedDataDir(where)}): start the service (npm start), or point DATABASE_URL at its database, e.g. DATABASE_URL=postgres://user@host:5432/db`)
  io.err(`idem: DATABASE_URL is not set: using the embedded PostgreSQL of this checkout (data in ${embedded.dir}, port ${embedded.port})\n`)
  return { database: embedded.url, pgbouncer: false }
}

/**
 * Runs `work` with the operations on the database, under the server's TTL and
 * retention (or those `given` on the command line), its action lines on
 * stderr; the pools closed after.
 */
export async function withOperations<T>(io: CliIo, given: GivenSettings, work: (ops: Operations) => Promise<T>): Promise<T> {
  const { database, pgbouncer } = databaseOf(io)
  const pools = openPools(database, { applicationName: 'idempotent-post:cli', shortMax: 2, workMax: 1, pgbouncer })
  try {
    const settings = await serverSettings(pools.short, io, given)
    // Action lines on stderr: stdout is the command's own output (tables, --json), for a person or a pipe.
    const log = createLogger({ sink: (line) => io.err(`${line}\n`), base: { component: 'cli' } })
    return await work(operations({ sql: pools.short, ttlSeconds: settings.ttlSeconds, retentionSeconds: settings.retentionSeconds, log }))
  } finally {
    await pools.close(5)
  }
}
