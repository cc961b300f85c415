import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { driverConnection, type ConnectionSettings } from './connection-settings'
import { requireUtf8 } from './encoding'
import { processAlive } from '../core/processes'

/** sql/: one folder per migration line (sql/README.md). */
export const SQL_DIR = join(import.meta.dir, '..', '..', 'sql')

/**
 * A line of numbered, forward-only migrations with a table of its own that
 * records which of them a database has. Lines are applied in the order
 * given; a later line may rely on an earlier one, never the reverse.
 */
export interface MigrationLine {
  /** For messages: "engine", "service". */
  readonly name: string
  /** The table that records this line's versions in a database. */
  readonly table: string
  /** Its files: NNNNN_name.sql, numbered from 00001 without gaps. */
  readonly dir: string
}

/** The engine's tables (keys, processes, settings, audit): what `migrate()` of `idempotent-post/engine` applies, and all a plugin user gets. */
export const ENGINE_MIGRATIONS: MigrationLine = Object.freeze({ name: 'engine', table: 'idempotency_migrations', dir: join(SQL_DIR, 'engine') })
/** The reference service's tables (payments; later the admin's sessions), on top of the engine's. */
export const SERVICE_MIGRATIONS: MigrationLine = Object.freeze({ name: 'service', table: 'service_migrations', dir: join(SQL_DIR, 'service') })
/** What the payments service runs on: both lines, the engine's first. */
export const SERVICE_LINES: readonly MigrationLine[] = Object.freeze([ENGINE_MIGRATIONS, SERVICE_MIGRATIONS])

/** Any fixed number; it only has to be the same in every process of this product, every release (the single-line runner used it too). */
export const MIGRATION_LOCK_ID = 7_246_013_917

interface Migration {
  readonly version: number
  readonly name: string
  readonly file: string
  /**
   * `-- @online`: the release before it keeps working on it (an expand step:
   * a nullable column, a new table, a storage parameter). A release that
   * does not know it yet still starts and serves on a database that has it.
   */
  readonly online: boolean
  /**
   * `-- @contract requires <line> <version>, ...`: a contract step, applied
   * only once every live process of the database runs code that knows those
   * migrations (its heartbeat says so); until then it, and the rest of its
   * line, wait for a later run.
   */
  readonly requires?: Readonly<Record<string, number>>
  /**
   * `-- @no-transaction`: its statements run one by one, each committing on
   * its own, for those that refuse a transaction block (CREATE INDEX
   * CONCURRENTLY: an index built on a large table while it is written). So
   * each statement must be safe to run again (a run that fails part-way is
   * run again from its first statement). On a new database, whose tables are
   * empty, they run in the one transaction with the others, CONCURRENTLY
   * dropped: there is nothing to wait for.
   */
  readonly transaction: boolean
}

const FILE = /^(\d{5})_([a-z0-9_]+)\.sql$/
const ONLINE = /^--\s*@online\b/m
const CONTRACT = /^--\s*@contract\s+requires\s+(.+)$/m
const NO_TRANSACTION = /^--\s*@no-transaction\b/m

/** The directives of a migration's text (see Migration). */
function directivesOf(text: string, file: string): Pick<Migration, 'online' | 'requires'> {
  const contract = CONTRACT.exec(text)
  if (!contract) return { online: ONLINE.test(text) }
  const requires: Record<string, number> = {}
  for (const part of contract[1]!.split(',')) {
    const match = /^\s*([a-z]+)\s+(\d+)\s*$/.exec(part)
    if (!match) throw new Error(`${file}: "@contract requires" takes "<line> <version>, ...", got ${JSON.stringify(contract[1])}`)
    requires[match[1]!] = Number(match[2])
  }
  if (ONLINE.test(text)) throw new Error(`${file}: a contract step is not @online`)
  return { online: false, requires }
}

/** A line's files in order; a gap or a duplicate number is refused (a half-merged branch, a typo). */
export function migrationsOf(line: MigrationLine): Migration[] {
  const migrations = readdirSync(line.dir).flatMap((file) => {
    const match = FILE.exec(file)
    if (!match) return []
    const path = join(line.dir, file)
    const text = readFileSync(path, 'utf8')
    return [{ version: Number(match[1]), name: match[2]!, file: path, transaction: !NO_TRANSACTION.test(text), ...directivesOf(text, path) }]
  }).sort((a, b) => a.version - b.version)
  migrations.forEach((migration, index) => {
    if (migration.version !== index + 1) throw new Error(`${line.dir}: migration ${index + 1} is missing or numbered twice (found ${migration.version}); number them 00001, 00002, ... without gaps`)
  })
  return migrations
}

/**
 * The single line this product used before the engine and the service had
 * lines of their own: postgres-shift's `migrations` table, versions 1..4,
 * named after these files. A database migrated by it is adopted: each of
 * its versions maps to the versions of the new lines that hold the same
 * statements (the split of sql/ into sql/engine and sql/service), so
 * nothing is run twice and no row moves.
 */
const LEGACY_TABLE = 'migrations'
const LEGACY: readonly { name: string; engine: number; service: number }[] = [
  { name: 'idempotency_keys.sql', engine: 1, service: 0 },
  { name: 'payments.sql', engine: 1, service: 1 },
  { name: 'admin_audit.sql', engine: 2, service: 1 },
  { name: 'atomic_phases.sql', engine: 3, service: 2 },
]
/**
 * Written into the old table once adopted: the old runner refuses a
 * database whose version is beyond the files it knows ("newer than this
 * release"), so an old release started during a rolling upgrade stops
 * instead of running on a schema it does not know.
 */
const LEGACY_TOMBSTONE = { version: LEGACY.length + 1, name: `superseded by ${ENGINE_MIGRATIONS.table} and ${SERVICE_MIGRATIONS.table}` }

export interface MigrationResult {
  /** Migrations applied by this run, all lines together. */
  readonly applied: number
  /** Each line's version after the run, by line name. */
  readonly versions: Readonly<Record<string, number>>
  /** The old single-line layout was found and recorded in the new lines by this run. */
  readonly adopted: boolean
  /** Contract steps left for a later run: live processes of an older release still serve. */
  readonly pending?: readonly PendingContract[]
  /** Lines whose database is ahead of this release by online steps only (a newer release migrated it): served as is. */
  readonly ahead?: Readonly<Record<string, number>>
}

export interface PendingContract {
  readonly line: string
  readonly version: number
  readonly name: string
  /** What it requires every live process to know, by line. */
  readonly requires: Readonly<Record<string, number>>
  /** Live processes whose code does not know what the step requires. */
  readonly waitingFor: number
  /**
   * Of them, those that did not say what they know (no schemaKnown in their
   * heartbeat): a release before the heartbeat said so, or an app on the
   * plugin or the engine that starts its heartbeat without it. Not
   * necessarily an older release.
   */
  readonly unsaid?: number
}

/**
 * Who a pending contract step waits for, in words: a process that said it
 * knows an older schema is an older release; one that said nothing may be an
 * app on the plugin (startHeartbeat without schemaKnown), not a release at all.
 */
export function describeWaiting(step: Pick<PendingContract, 'waitingFor' | 'unsaid'>): string {
  const unsaid = step.unsaid ?? 0
  const older = step.waitingFor - unsaid
  return [
    ...(older > 0 ? [`${older} live process(es) of an older release`] : []),
    ...(unsaid > 0 ? [`${unsaid} live process(es) that do not say which schema they know (an earlier release, or an app on the plugin or engine whose startHeartbeat has no schemaKnown)`] : []),
  ].join(' and ')
}

/**
 * Every line's version this release knows, by line name: what each process
 * writes into its heartbeat row (idempotency_processes.schema_known), so a
 * contract step knows when no process of an older release is left.
 */
export function knownVersions(lines: readonly MigrationLine[] = SERVICE_LINES): Record<string, number> {
  return Object.fromEntries(lines.map((line) => [line.name, migrationsOf(line).length]))
}

/**
 * A lock the migration waits for no longer than this: an online step takes
 * its lock for milliseconds, but waiting for one puts every query of the
 * serving release on that table in the queue behind it, and the service's
 * own statements give up after 1 s (store/db.ts LOCK_TIMEOUT_MS). Past it the
 * step is rolled back and tried again (LOCK_ATTEMPTS, a growing pause), the
 * service serving between.
 */
const MIGRATION_LOCK_TIMEOUT_MS = 500
const LOCK_ATTEMPTS = 20

/**
 * Applies the pending migrations of `lines` (default: the engine's only)
 * to the database at `url`.
 *
 * Several processes starting at once would race, so the whole run holds a
 * session advisory lock on a single-connection client: the others wait,
 * then find nothing left to do. On a new database everything runs in one
 * transaction: a failed file leaves it as it was. On a database in use each
 * file runs in a short transaction of its own, recorded with it (a failed
 * file leaves the database after the last one that succeeded), so an online
 * step holds its lock for its own statement only. A database
 * migrated by a newer release (a version beyond this release's files) is
 * refused rather than run against a schema we don't understand.
 */
export async function migrate(database: string | ConnectionSettings, options: { lines?: readonly MigrationLine[] } = {}): Promise<MigrationResult> {
  const lines = options.lines ?? [ENGINE_MIGRATIONS]
  const known = new Map(lines.map((line) => [line, migrationsOf(line)]))
  // Where and how to connect as the start check resolved them (connection-settings.ts): a URL is resolved with this process's environment.
  const { url, options: where } = driverConnection(database)
  const sql = postgres(url, { ...(where as object), max: 1, fetch_types: false, onnotice: () => undefined, connect_timeout: 10, connection: { lock_timeout: MIGRATION_LOCK_TIMEOUT_MS } as never })
  try {
    await requireUtf8(sql)
    // Another migrator's run is waited for as long as it takes: lock_timeout bounds a step's table locks,
    // not this wait (under it, a migrator that waited 0.5 s for another failed with 55P03).
    await takeMigrationLock(sql)
    // A database no line has touched yet serves nobody: everything in one transaction, nothing half-made.
    const fresh = (await Promise.all(lines.map((line) => versionOf(sql, line)))).every((version) => version === 0) && await legacyVersion(sql) === undefined
    if (fresh) return await retryingLocks(() => sql.begin((tx) => applyPending(tx, lines, known, (step) => step(tx), true)))
    // A serving database: one short transaction per file, so no step holds its lock while the next one waits for another.
    return await applyPending(sql, lines, known, <T>(step: (tx: Sql) => Promise<T>) => retryingLocks(() => sql.begin(step) as Promise<T>), false, sql)
  } finally {
    await sql`select pg_advisory_unlock(${MIGRATION_LOCK_ID})`.catch(() => undefined)
    await sql.end({ timeout: 5 })
  }
}

/** How often a migrator waiting for another asks for the lock again. */
const MIGRATION_LOCK_POLL_MS = 100

/**
 * Takes the migration lock (MIGRATION_LOCK_ID) on this session, waiting for
 * another migrator's run as long as it takes, by asking again and again
 * rather than inside pg_advisory_lock(): a session waiting in a statement
 * holds a snapshot, and an index built CONCURRENTLY by the migrator it waits
 * for (a @no-transaction step, or Citus distributing a table online) waits
 * for every older snapshot of the database: the two waited for each other
 * (40P01, deadlock detected, when eight migrators started at once).
 */
export async function takeMigrationLock(sql: postgres.Sql): Promise<void> {
  while (!(await sql<{ got: boolean }[]>`select pg_try_advisory_lock(${MIGRATION_LOCK_ID}) as got`)[0]!.got)
    await Bun.sleep(MIGRATION_LOCK_POLL_MS)
}

/** Runs `run` again (with a growing pause) while it fails on a lock it waited MIGRATION_LOCK_TIMEOUT_MS for. */
async function retryingLocks<T>(run: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await run()
    } catch (error) {
      if ((error as { code?: unknown }).code !== '55P03' || attempt >= LOCK_ATTEMPTS) throw error
      await Bun.sleep(100 * attempt)
    }
  }
}

type Step = <T>(body: (tx: Sql) => Promise<T>) => Promise<T>

async function applyPending(sql: Sql, lines: readonly MigrationLine[], known: ReadonlyMap<MigrationLine, Migration[]>, step: Step, fresh: boolean, session?: postgres.Sql): Promise<MigrationResult> {
  const adopted = await step(async (tx) => {
    const found = await adoptLegacy(tx)
    for (const line of lines) await ensureTable(tx, line)
    return found
  })
  let applied = 0
  const versions: Record<string, number> = {}
  const pending: PendingContract[] = []
  const ahead: Record<string, number> = {}
  for (const line of lines) {
    const migrations = known.get(line)!
    const current = await versionOf(sql, line)
    versions[line.name] = current
    if (current > migrations.length) {
      await requireOnlineAhead(sql, line, migrations.length, current)
      ahead[line.name] = current
      continue
    }
    for (const migration of migrations.slice(current)) {
      if (!migration.transaction && !fresh && session) {
        await runOutsideTransaction(session, migration)
        await step((tx) => tx`insert into ${tx(line.table)} (version, name, online) values (${migration.version}, ${migration.name}, ${migration.online})`)
        versions[line.name] = migration.version
        applied++
        continue
      }
      const { waitingFor, unsaid } = await step(async (tx) => {
        if (migration.requires) {
          const waiting = await processesNotKnowing(tx, migration.requires)
          if (waiting.waitingFor > 0) return waiting
        }
        // One statement at a time, even in a file's own transaction: Citus propagates a DDL statement on a
        // distributed table to its workers as the text the client sent, and a whole file sent at once reached
        // them as several commands, which they refuse in a prepared statement (engine 23: an UPDATE and an
        // ALTER TABLE; "cannot insert multiple commands into a prepared statement").
        const text = readFileSync(migration.file, 'utf8')
        for (const statement of statementsOf(text)) await tx.unsafe(migration.transaction ? statement : statement.replace(CONCURRENTLY, '$1'))
        await tx`insert into ${tx(line.table)} (version, name, online) values (${migration.version}, ${migration.name}, ${migration.online})`
        return { waitingFor: 0, unsaid: 0 }
      })
      if (waitingFor > 0) {
        pending.push({ line: line.name, version: migration.version, name: migration.name, requires: migration.requires!, waitingFor, unsaid })
        break
      }
      versions[line.name] = migration.version
      applied++
    }
  }
  return { applied, versions, adopted, ...(pending.length ? { pending } : {}), ...(Object.keys(ahead).length ? { ahead } : {}) }
}

/** A CONCURRENTLY that a transaction refuses, with what precedes it (kept): comment lines, then the command. */
const CONCURRENTLY = /^((?:\s*--[^\n]*\n)*\s*(?:create\s+(?:unique\s+)?index|drop\s+index|reindex\s+(?:index|table)))\s+concurrently\b/i

/**
 * A @no-transaction file on a serving database: each statement on its own,
 * committing as it ends; one that waits for a lock is run again as the others
 * are (retryingLocks). An index built CONCURRENTLY waits for the transactions
 * older than it without blocking anyone: it may wait as long as they take.
 */
async function runOutsideTransaction(sql: postgres.Sql, migration: Migration): Promise<void> {
  if (migration.requires) throw new Error(`${migration.file}: a contract step cannot be @no-transaction`)
  for (const statement of statementsOf(readFileSync(migration.file, 'utf8'))) {
    if (!CONCURRENTLY.test(statement)) {
      await retryingLocks(() => sql.unsafe(statement))
      continue
    }
    await sql`set lock_timeout = 0`
    try {
      await sql.unsafe(statement)
    } finally {
      await sql.unsafe(`set lock_timeout = ${MIGRATION_LOCK_TIMEOUT_MS}`)
    }
  }
}

/**
 * The statements of a migration's text, split at each `;` outside quotes,
 * dollar-quoted bodies and comments (a DO block or a function is one).
 */
export function statementsOf(text: string): string[] {
  const statements: string[] = []
  let start = 0
  let i = 0
  const push = (end: number) => {
    const statement = text.slice(start, end).trim()
    if (statement.replace(/--[^\n]*/g, '').trim()) statements.push(statement)
    start = end + 1
  }
  while (i < text.length) {
    const rest = text.slice(i)
    if (rest.startsWith('--')) { const end = text.indexOf('\n', i); i = end < 0 ? text.length : end + 1; continue }
    if (rest.startsWith('/*')) { const end = text.indexOf('*/', i + 2); i = end < 0 ? text.length : end + 2; continue }
    const quote = text[i]
    if (quote === "'" || quote === '"') {
      let j = i + 1
      while (j < text.length && !(text[j] === quote && text[j + 1] !== quote)) j += text[j] === quote ? 2 : 1
      i = j + 1
      continue
    }
    const dollar = /^\$([A-Za-z_][A-Za-z0-9_]*)?\$/.exec(rest)
    if (dollar) { const end = text.indexOf(dollar[0], i + dollar[0].length); i = end < 0 ? text.length : end + dollar[0].length; continue }
    if (quote === ';') push(i)
    i++
  }
  push(text.length)
  return statements
}

/**
 * A database a newer release migrated is served as is when every step
 * beyond this release's files was recorded online (the newer release says
 * this one keeps working on it); any other is refused.
 */
async function requireOnlineAhead(sql: Sql, line: MigrationLine, known: number, current: number): Promise<void> {
  const [row] = await sql<{ offline: number }[]>`
    select count(*)::int as offline from ${sql(line.table)} where version > ${known} and not online`
  if (row!.offline > 0)
    throw new Error(`the database's ${line.name} schema is at migration ${current}, newer than this release knows (${known}), with changes this release cannot run on; upgrade the service`)
}

/**
 * Live processes (a fresh heartbeat) whose code does not know every version
 * `requires` names: a process that did not say what it knows (a release
 * before the heartbeat said so) counts as knowing none; one that knows
 * nothing of a line (a plugin app, for the service's line) does not use it.
 */
async function processesNotKnowing(sql: Sql, requires: Readonly<Record<string, number>>): Promise<{ waitingFor: number; unsaid: number }> {
  if (!await exists(sql, 'idempotency_processes')) return { waitingFor: 0, unsaid: 0 }
  const [row] = await sql<{ n: number; unsaid: number }[]>`
    select count(*)::int as n, count(*) filter (where p.schema_known is null)::int as unsaid from idempotency_processes p
     where ${processAlive(sql)}
       and (p.schema_known is null
            or exists (select 1 from jsonb_each_text(${sql.json(requires as Record<string, number>)}::jsonb) r(line, version)
                        where p.schema_known ? r.line and (p.schema_known->>r.line)::int < r.version::int))`
  return { waitingFor: row!.n, unsaid: row!.unsaid }
}

/** The payments service's schema: the engine's line, then the service's. */
export function migrateService(database: string | ConnectionSettings): Promise<MigrationResult> {
  return migrate(database, { lines: SERVICE_LINES })
}

type Sql = postgres.Sql | postgres.TransactionSql

async function ensureTable(sql: Sql, line: MigrationLine): Promise<void> {
  await sql`
    create table if not exists ${sql(line.table)} (
      version    integer     primary key check (version >= 1),
      name       text        not null,
      applied_at timestamptz not null default now()
    )`
  // Whether the release before each step keeps working on it (Migration.online); rows of earlier runners were not.
  await sql`alter table ${sql(line.table)} add column if not exists online boolean not null default false`
}

const exists = async (sql: Sql, table: string): Promise<boolean> =>
  (await sql<{ found: boolean }[]>`select to_regclass(${table}) is not null as found`)[0]!.found

/** The line's version in this database: 0 when its table does not exist yet. */
async function versionOf(sql: Sql, line: MigrationLine): Promise<number> {
  if (!await exists(sql, line.table)) return 0
  const [row] = await sql<{ version: number }[]>`select coalesce(max(version), 0)::int as version from ${sql(line.table)}`
  return row!.version
}

/**
 * The old layout's version when `migrations` is ours and not adopted yet:
 * every row is one of our old files at its number (so another tool's
 * `migrations` table is never taken for ours). Undefined otherwise.
 */
async function legacyVersion(sql: Sql): Promise<number | undefined> {
  if (await exists(sql, ENGINE_MIGRATIONS.table) || !await exists(sql, LEGACY_TABLE)) return undefined
  const rows = await sql<{ id: number; name: string }[]>`select migration_id::int as id, name from ${sql(LEGACY_TABLE)} order by migration_id`
  const ours = rows.length > 0 && rows.length <= LEGACY.length && rows.every((row, index) => row.id === index + 1 && row.name === LEGACY[index]!.name)
  return ours ? rows.length : undefined
}

/** Records a database of the old layout in the new lines, with the time each old version was applied. */
async function adoptLegacy(sql: Sql): Promise<boolean> {
  const version = await legacyVersion(sql)
  if (version === undefined) return false
  const { engine, service } = LEGACY[version - 1]!
  for (const [line, upTo] of [[ENGINE_MIGRATIONS, engine], [SERVICE_MIGRATIONS, service]] as const) {
    if (upTo === 0) continue
    await ensureTable(sql, line)
    const migrations = migrationsOf(line).slice(0, upTo)
    for (const migration of migrations) {
      // Applied when the old version holding its statements was (the first old version that maps to it).
      const from = LEGACY.findIndex((entry) => (line === ENGINE_MIGRATIONS ? entry.engine : entry.service) >= migration.version) + 1
      await sql`
        insert into ${sql(line.table)} (version, name, applied_at)
        select ${migration.version}, ${migration.name}, created_at from ${sql(LEGACY_TABLE)} where migration_id = ${from}`
    }
  }
  await sql`insert into ${sql(LEGACY_TABLE)} (migration_id, name) values (${LEGACY_TOMBSTONE.version}, ${LEGACY_TOMBSTONE.name})`
  return true
}

/**
 * Behind PgBouncer in transaction mode the session advisory lock above would
 * be taken on one server connection and released on another, or never: the
 * next start would wait forever. So the service does not migrate there; it
 * only checks that someone did (`npm run migrate` with a direct DATABASE_URL),
 * and refuses to run on a schema other than the one it knows.
 */
export async function checkSchema(database: string | ConnectionSettings, options: { prepare?: boolean; lines?: readonly MigrationLine[] } = {}): Promise<Readonly<Record<string, number>>> {
  const lines = options.lines ?? SERVICE_LINES
  const { url, options: where } = driverConnection(database)
  const sql = postgres(url, { ...(where as object), max: 1, fetch_types: false, onnotice: () => undefined, connect_timeout: 10, prepare: options.prepare ?? true })
  try {
    await requireUtf8(sql)
    const versions: Record<string, number> = {}
    for (const line of lines) {
      const known = migrationsOf(line).length
      const version = await versionOf(sql, line)
      // A contract step still waiting for an older release to leave is no step this release needs.
      if (version < known && !migrationsOf(line).slice(version).every((migration) => migration.requires))
        throw new Error(`the database's ${line.name} schema is at migration ${version}, this release needs ${known}: run \`npm run migrate\` with DATABASE_URL pointing at PostgreSQL directly (not through PgBouncer)`)
      if (version > known) await requireOnlineAhead(sql, line, known, version)
      versions[line.name] = version
    }
    return versions
  } finally {
    await sql.end({ timeout: 5 })
  }
}

/** "engine 3, service 2": a run's versions, for a log line. */
export function describeVersions(versions: Readonly<Record<string, number>>): string {
  return Object.entries(versions).map(([line, version]) => `${line} ${version}`).join(', ')
}
