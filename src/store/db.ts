import postgres from 'postgres'
import { provideWorkerPools, WorkerPools } from '../core/worker-pools'
import { errorText, log } from '../log'
import { driverConnection, resolveConnection, type ConnectionSettings, type DriverConnection } from './connection-settings'
import { countedPool, PoolUsageCounter, type PoolUsage } from './pool-usage'

export type Pool = postgres.Sql<Record<string, never>>

/**
 * Seconds to wait for a connection. With postgres.js defaults a request hung
 * up to ~20 s during a 5 s outage; 2 s lets it fail fast with a 503 instead.
 */
const CONNECT_TIMEOUT_SECONDS = 2
/**
 * Seconds between reconnect attempts while the database is away. postgres.js
 * backs off by 3^n/100 s up to 20 s, counted across the pool, so during a 3 s
 * outage queued queries waited up to ~19 s and the service took seconds to
 * notice the database was back (test/chaos/postgres-restart.test.ts). A
 * refused connect costs next to nothing, so retry often: 0.1, 0.2, 0.4, then
 * every 0.5 s.
 */
export function reconnectBackoff(retries: number): number {
  return Math.min(0.05 * 2 ** retries, 0.5)
}
/** No single statement of ours takes a second; 5 s means the database is in trouble. */
export const STATEMENT_TIMEOUT_MS = 5_000
/**
 * Nothing of ours holds a row lock across anything slower than a pipelined
 * statement (core/complete.ts), so a second of waiting on one means something
 * is wrong, and 55P03 is then answered as "in progress".
 */
export const LOCK_TIMEOUT_MS = 1_000
/**
 * The database ends a transaction of ours that sits idle this long: our only
 * transaction (the completion) pipelines its statements, so it is never idle
 * for more than a round trip. A process that hangs, or whose connection goes
 * half-open, between its completing UPDATE and COMMIT would otherwise hold the
 * key's row lock until TCP gives up (hours); with this the lock is gone within
 * seconds and the key can be reclaimed (Bounded processing, docs/explanation/invariants.md).
 */
export const IDLE_IN_TRANSACTION_TIMEOUT_MS = 5_000
/**
 * TCP keepalive on both ends, in seconds: a peer that vanished (partition,
 * SIGKILLed host) is detected in about IDLE + INTERVAL * COUNT = 11 s instead
 * of the kernel's two hours, and its backend ends.
 */
const KEEPALIVE_IDLE_SECONDS = 5
const KEEPALIVE_INTERVAL_SECONDS = 2
const KEEPALIVE_COUNT = 3

/**
 * The session settings above, in pg_settings' own units (ms for timeouts, s
 * for keepalives), under their server names: one home for the startup
 * parameters of a direct connection, for the ALTER ROLE statements that put
 * them in force behind PgBouncer, and for the check that they are.
 */
export const SESSION_SETTINGS: Readonly<Record<string, number | string>> = Object.freeze({
  // Pinned whatever the database's or the role's default (SPEC invariant 13):
  // under serializable or repeatable read, concurrent claims of one key fail
  // with 40001 (128 of 2,657 answers were 500s in test/store/database-contract.test.ts),
  // and the engine's fencing is written for READ COMMITTED's row re-checks.
  default_transaction_isolation: 'read committed',
  statement_timeout: STATEMENT_TIMEOUT_MS,
  lock_timeout: LOCK_TIMEOUT_MS,
  idle_in_transaction_session_timeout: IDLE_IN_TRANSACTION_TIMEOUT_MS,
  tcp_keepalives_idle: KEEPALIVE_IDLE_SECONDS,
  tcp_keepalives_interval: KEEPALIVE_INTERVAL_SECONDS,
  tcp_keepalives_count: KEEPALIVE_COUNT,
  // Our statements are index probes and short ranges: JIT never pays for one, and one misestimate costs a whole
  // compilation. The purge's batch at 10 M keys of the new form took 566 ms, 559 of them compiling (its CASE
  // guessed 1,508 rows of 1.36 M, pricing the LIMIT past jit_optimize_above_cost), and purged nothing in a run.
  jit: 'off',
})

/**
 * Behind PgBouncer in transaction mode (DATABASE_PGBOUNCER=1) startup
 * parameters other than a few (application_name, client_encoding, ...) are
 * refused, and a SET would stick to whichever server connection ran it. So
 * the operator sets SESSION_SETTINGS on the service's role in its database,
 * once: stored in the catalog, they apply to every session of that role there,
 * through any pooler, and survive a failover (the catalog is replicated).
 * PgBouncer's connect_query would do too, but lives outside the database and
 * is lost when the pooler's config is rebuilt (docs/how-to/pgbouncer.md).
 */
export function sessionSettingsSql(role: string, database: string): string {
  const ident = (name: string) => `"${name.replaceAll('"', '""')}"`
  return Object.entries(SESSION_SETTINGS)
    .map(([name, value]) => `alter role ${ident(role)} in database ${ident(database)} set ${name} = ${typeof value === 'string' ? `'${value}'` : value};`)
    .join('\n')
}

/** The SESSION_SETTINGS this connection does not run with, as "name = actual (want expected)"; empty when all hold. */
export async function missingSessionSettings(sql: postgres.Sql<any>): Promise<string[]> {
  const rows = await sql<{ name: string; setting: string }[]>`
    select name, setting from pg_settings where name in ${sql(Object.keys(SESSION_SETTINGS))}`
  const actual = new Map(rows.map((row) => [row.name, row.setting]))
  return Object.entries(SESSION_SETTINGS)
    .filter(([name, value]) => actual.get(name) !== String(value))
    .map(([name, value]) => `${name} = ${actual.get(name) ?? 'unknown'} (want ${value})`)
}

/**
 * postgres.js (3.4) options that depend on where DATABASE_URL points, shared
 * by the pools and the health probe: where and how to connect, resolved once
 * (connection-settings.ts) and given as options, which postgres.js takes over
 * anything it would read from the URL or the environment, so the TLS mode the
 * start check judged is the one every connection uses.
 *
 * - PgBouncer (1.18, transaction mode) keeps no prepared statement across
 *   transactions: a statement prepared on one server connection is missing on
 *   the next ("prepared statement does not exist"), so nothing is prepared.
 * - postgres.js reads `target_session_attrs=read-write` as "the server reports
 *   default_transaction_read_only = off", which a hot standby of PostgreSQL 14+
 *   also reports: during a failover a reconnect would settle on the standby
 *   that is not yet promoted, and every write on that connection failed (25006)
 *   (seen in test/scale/failover.scale.ts). `primary` (not in recovery) is what
 *   read-write means for us, as in libpq (connection-settings.ts maps it).
 */
export function driverOptions(database: string | ConnectionSettings, pgbouncer: boolean): DriverConnection['options'] & { prepare?: boolean } {
  return { ...driverConnection(database).options, ...(pgbouncer ? { prepare: false } : {}) }
}

/** `database` resolved: a URL is read with this process's environment, as the start check reads it. */
export function connectionOf(database: string | ConnectionSettings): ConnectionSettings {
  return typeof database === 'string' ? resolveConnection(database) : database
}

export interface Pools {
  /**
   * Single statements in autocommit: claims and declarative completions
   * (which share statements: core/lane.ts), replays, reads, releases.
   */
  readonly short: Pool
  /**
   * The completing transactions (core/complete.ts), each held for a couple of
   * pipelined round trips, never across a handler's foreign call: a separate
   * pool so a burst of them never queues the claims and 409s.
   */
  readonly work: Pool
  /** Connections in use and work waiting, per pool (pool-usage.ts), for the metrics. */
  readonly usage?: { readonly short: PoolUsage; readonly work: PoolUsage }
  /**
   * On Citus only: a pool per worker, of the short pool's size, for the
   * lane's calls of that worker's tenants (core/worker-pools.ts), opened on
   * its first call; none on one PostgreSQL.
   */
  readonly workers?: WorkerPools
  /** Each worker pool's usage, by worker (host:port), for the metrics: none until its pool opens. */
  readonly workerUsage?: ReadonlyMap<string, PoolUsage>
  close(timeoutSeconds?: number): Promise<void>
}

export interface PoolOptions {
  /** Connections for single statements per process. @default 8 */
  readonly shortMax?: number
  /** Connections for completing transactions per process. @default 8 */
  readonly workMax?: number
  readonly applicationName?: string
  /** DATABASE_PGBOUNCER=1: no prepared statements, and SESSION_SETTINGS come from the role, not startup parameters. @default false */
  readonly pgbouncer?: boolean
}

function connect(database: ConnectionSettings, max: number, applicationName: string, pgbouncer: boolean): Pool {
  const { url } = driverConnection(database)
  return postgres(url, {
    ...(driverOptions(database, pgbouncer) as object),
    max,
    connect_timeout: CONNECT_TIMEOUT_SECONDS,
    backoff: reconnectBackoff,
    idle_timeout: 60,
    max_lifetime: 30 * 60,
    keep_alive: KEEPALIVE_IDLE_SECONDS,
    // No type query on connect: postgres.js 3.4.9 runs it from a promise
    // nobody handles (connection.js fetchArrayTypes), so a connection
    // terminated or reset while it ran rejected unhandled, and Bun exited
    // with every request of the process (porsager/postgres#279). We bind no
    // arrays through the driver (core/pg-array.ts), and never reserve()
    // (it hangs on a new connection without the type query: #751).
    fetch_types: false,
    onnotice: () => undefined,
    // bigint (lease) stays a string: exact, and JSON-safe.
    connection: pgbouncer ? { application_name: applicationName } : { application_name: applicationName, ...SESSION_SETTINGS },
  }) as Pool
}

/** Two pools, so that completions can never starve the claims and 409 answers of connections (No blocked connections, docs/explanation/invariants.md). */
export function openPools(database: string | ConnectionSettings, options: PoolOptions = {}): Pools {
  const settings = connectionOf(database)
  const name = options.applicationName ?? 'idempotent-post'
  const pgbouncer = options.pgbouncer ?? false
  const usage = { short: new PoolUsageCounter(options.shortMax ?? 8), work: new PoolUsageCounter(options.workMax ?? 8) }
  const short = countedPool(connect(settings, usage.short.max, `${name}:short`, pgbouncer), usage.short)
  const work = countedPool(connect(settings, usage.work.max, `${name}:work`, pgbouncer), usage.work)
  const workerUsage = new Map<string, PoolUsageCounter>()
  const workers = new WorkerPools(short, (worker) => {
    const counter = new PoolUsageCounter(usage.short.max)
    workerUsage.set(worker, counter)
    return countedPool(connect(settings, counter.max, `${name}:worker ${worker}`, pgbouncer), counter)
  })
  provideWorkerPools(short, workers)
  if (pgbouncer) warnOnMissingSessionSettings(short)
  return {
    short,
    work,
    usage,
    workers,
    workerUsage,
    async close(timeoutSeconds = 5) {
      await Promise.all([short.end({ timeout: timeoutSeconds }), work.end({ timeout: timeoutSeconds }), workers.close(timeoutSeconds)])
    },
  }
}

/**
 * Behind PgBouncer the settings depend on the operator's ALTER ROLE: say at
 * start, loudly, when they are not in force, since the deadlines of invariant
 * 7 rest on them. Not fatal: a start against a database that is still coming
 * up must not be refused, and the service works (less guarded) without them.
 */
function warnOnMissingSessionSettings(sql: Pool): void {
  const check = async () => {
    const missing = await missingSessionSettings(sql)
    if (missing.length === 0) return
    const [who] = await sql<{ role: string; database: string }[]>`select current_user as role, current_database() as database`
    log.error(`DATABASE_PGBOUNCER=1, but these session settings are not in force: ${missing.join(', ')}. ` +
      `Run as an administrator:\n${sessionSettingsSql(who!.role, who!.database)}\n(docs/how-to/pgbouncer.md)`, { missing })
  }
  check().catch((error: unknown) => log.error(`DATABASE_PGBOUNCER=1: could not check the session settings: ${errorText(error)}`, { error }))
}

/** True when the database answers within `timeoutMs`. */
export async function databaseAnswers(sql: Pool, timeoutMs = 1_000): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<false>((resolve) => { timer = setTimeout(() => resolve(false), timeoutMs) })
  try {
    return await Promise.race([sql`select 1`.then(() => true, () => false), timeout])
  } finally {
    clearTimeout(timer)
  }
}
