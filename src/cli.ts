#!/usr/bin/env bun
/**
 * The operator CLI: `npm run idem -- <command>` or `idem <command>`. A thin
 * caller of src/operations, like the admin page and its JSON API: the same
 * operations, the same audit trail (as "cli:<who>"), the same snake_case JSON
 * (--json prints what /admin/api answers). It applies the server's TTL and
 * retention as the server recorded them, never its own shell's; on an app's
 * database, where no server records them, the operator names them
 * (--ttl-seconds, --retention-seconds). It reads DATABASE_URL with the
 * server's own parser (config.ts); unset, it finds the embedded PostgreSQL
 * `npm start` runs for this checkout, by the rules that placed it.
 *
 * Every destructive command (expire, expire-stale, purge) shows what it would
 * do and asks, unless given --yes; --dry-run shows it and changes nothing.
 * Each action writes one JSON log line to stderr (src/log.ts), as the server
 * does for the page and the JSON API; its audit entry is the record.
 *
 * Exit codes: 0 done (or, with --dry-run, shown); 1 refused or failed (a live
 * worker holds the key, the key changed, the operator answered no, the
 * database failed); 2 usage (bad arguments, no database to find, no actor,
 * settings neither recorded nor given, a destructive command without --yes
 * where nobody can be asked).
 */
import { userInfo } from 'node:os'
import { createInterface } from 'node:readline/promises'
import { Command, CommanderError, InvalidArgumentError } from 'commander'
import { ConfigError, DEFAULT_EMBEDDED_DIR, loadDatabaseConfig } from './config'
import { readServerSettings } from './core/settings'
import type { Sql } from './core/types'
import { OperationInputError, operations, parseAuditFilters, parseKeyFilters, parseReleaseReason, type Operations } from './operations'
import { formatAge, formatTime } from './operations/format'
import * as json from './operations/json'
import { MAX_PAGE_SIZE } from './operations/list'
import { ownerText, previewText } from './operations/describe'
import { operatorSettings, type GivenSettings, type OperatorSettings } from './operations/context'
import { openPools } from './store/db'
import { createLogger } from './log'
import { embeddedDataDir, findRunningEmbedded } from './store/embedded'
import { RELEASE_REASONS } from './core/release'
import { visibleBidi } from './characters'

export const EXIT = { ok: 0, refused: 1, usage: 2 } as const

export class UsageError extends Error {}
export class RefusedError extends Error {}

/** What the CLI talks to: the process by default; tests give their own terminal and user. */
export interface CliIo {
  readonly env: Readonly<Record<string, string | undefined>>
  readonly out: (text: string) => void
  readonly err: (text: string) => void
  /** Whether someone sits at a terminal to be asked (stdin and stderr are TTYs). */
  readonly interactive: boolean
  /** Asks one question on the terminal and returns the answer line. */
  readonly ask: (question: string) => Promise<string>
  /** The OS user (passwd entry) of this process; throws when it has none. */
  readonly osUser: () => string
}

export const processIo: CliIo = {
  env: process.env,
  out: (text) => process.stdout.write(text),
  err: (text) => process.stderr.write(text),
  interactive: Boolean(process.stdin.isTTY && process.stderr.isTTY),
  async ask(question) {
    const prompt = createInterface({ input: process.stdin, output: process.stderr })
    try {
      return await prompt.question(question)
    } finally {
      prompt.close()
    }
  },
  osUser() {
    const { username } = userInfo()
    if (username !== 'unknown') return username
    // Bun answers "unknown" where Node throws ENOENT (this uid has no passwd entry: a container's
    // arbitrary uid), and also when it could not tell (seen as root with $USER unset). id(1) asks NSS.
    const id = Bun.spawnSync(['id', '-un'], { stdout: 'pipe', stderr: 'ignore' })
    if (id.exitCode !== 0) throw new Error('no passwd entry')
    return id.stdout.toString().trim()
  },
}

/** Operator names for the audit trail: printable, short, no spaces at the ends. */
const ACTOR_NAME = /^[!-~](?:[ -~]{0,118}[!-~])?$/

/**
 * Who runs a command, for the audit trail: the OS user of this uid (else
 * $USER), which the shell session vouches for; `--actor` is what the operator
 * says of themselves, kept beside it as a note (`cli:deploy (night shift)`),
 * never in its place: the trail's actor does not come from free text alone.
 * Never a made-up "unknown": with neither an OS user nor $USER, the uid
 * stands for it if --actor names the person; with nothing at all the action
 * is refused (exit 2) before anything is done.
 */
export function resolveActor(option: string | undefined, io: Pick<CliIo, 'env' | 'osUser'>, uid = process.getuid?.()): string {
  let note: string | undefined
  if (option !== undefined) {
    note = option.trim()
    if (!ACTOR_NAME.test(note)) throw new UsageError('--actor must be 1 to 120 printable characters')
  }
  let name: string | undefined
  try {
    name = io.osUser().trim() || undefined
  } catch {
    // no passwd entry for this uid (a container's arbitrary uid): try $USER
  }
  name ??= io.env.USER?.trim() || undefined
  if (name !== undefined && !ACTOR_NAME.test(name)) name = undefined
  if (name === undefined && note !== undefined && uid !== undefined) name = `uid-${uid}`
  if (name === undefined)
    throw new UsageError('no actor for the audit trail: $USER is unset and this uid has no passwd entry; name yourself with --actor <name>')
  return note === undefined ? `cli:${name}` : `cli:${name} (${note})`
}

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
function databaseOf(io: CliIo): { url: string; pgbouncer: boolean } {
  let config: ReturnType<typeof loadDatabaseConfig>
  try {
    config = loadDatabaseConfig(io.env)
  } catch (error) {
    if (error instanceof ConfigError) throw new UsageError(error.message)
    throw error
  }
  if (config.databaseUrl) return { url: config.databaseUrl, pgbouncer: config.databasePgbouncer }
  const where = { dir: config.embeddedDir, relocate: config.embeddedDir === DEFAULT_EMBEDDED_DIR }
  const embedded = findRunningEmbedded(where)
  if (!embedded)
    // Where the data is, not where it would be by default: as root in a private checkout it lives under /var/lib.
    throw new UsageError(`DATABASE_URL is not set, and no embedded PostgreSQL of this checkout is running (data in ${embeddedDataDir(where)}): start the service (npm start), or point DATABASE_URL at its database, e.g. DATABASE_URL=postgres://user@host:5432/db`)
  io.err(`idem: DATABASE_URL is not set: using the embedded PostgreSQL of this checkout (data in ${embedded.dir}, port ${embedded.port})\n`)
  return { url: embedded.url, pgbouncer: false }
}

/** --ttl-seconds, --retention-seconds: whole seconds, as the server's own settings are. */
function seconds(value: string): number {
  if (!/^\d{1,9}$/.test(value) || Number(value) < 1) throw new InvalidArgumentError('must be a whole number of seconds ≥ 1')
  return Number(value)
}

function positiveInt(value: string): number {
  if (!/^\d{1,4}$/.test(value) || Number(value) < 1) throw new InvalidArgumentError('must be a whole number ≥ 1')
  return Number(value)
}

function lease(value: string): string {
  if (!/^[1-9]\d{0,18}$/.test(value)) throw new InvalidArgumentError('must be a lease number as listed')
  return value
}

/** Control characters would move a terminal's cursor; keys cannot hold any (a table CHECK), other fields are cleaned anyway. */
const printable = (text: string): string => text.replace(/[\u0000-\u001f\u007f]/g, '?')

/** What a run ends with, when an action decides it (a refusal it reports itself). */
export interface RunState {
  exitCode: number
}

export function buildProgram(io: CliIo = processIo, state: RunState = { exitCode: EXIT.ok }): Command {
  const print = (line = ''): void => io.out(`${line}\n`)
  const printJson = (value: unknown): void => print(JSON.stringify(value, null, 2))
  /** Columns padded to their widest cell. */
  const table = (rows: string[][]): void => {
    const cells = rows.map((row) => row.map(printable))
    const widths = cells[0]!.map((_, column) => Math.max(...cells.map((row) => row[column]!.length)))
    for (const row of cells) print(row.map((cell, column) => cell.padEnd(widths[column]!)).join('  ').trimEnd())
  }

  async function withOperations<T>(work: (ops: Operations) => Promise<T>): Promise<T> {
    const { url, pgbouncer } = databaseOf(io)
    const pools = openPools(url, { applicationName: 'idempotent-post:cli', shortMax: 2, workMax: 1, pgbouncer })
    try {
      const { ttlSeconds, retentionSeconds } = program.opts<GivenSettings>()
      const settings = await serverSettings(pools.short, io, { ttlSeconds, retentionSeconds })
      // Action lines on stderr: stdout is the command's own output (tables, --json), for a person or a pipe.
      const log = createLogger({ sink: (line) => io.err(`${line}\n`), base: { component: 'cli' } })
      return await work(operations({ sql: pools.short, ttlSeconds: settings.ttlSeconds, retentionSeconds: settings.retentionSeconds, log }))
    } finally {
      await pools.close(5)
    }
  }

  /**
   * A destructive command goes ahead with --yes, or when the operator answers
   * "yes" at a terminal after reading what it will do; anywhere else (a
   * script, a pipe, cron) it refuses with exit 2, having done nothing.
   */
  async function confirmed(yes: boolean | undefined, what: string): Promise<void> {
    if (yes) return
    if (!io.interactive) throw new UsageError(`${what}\nrefusing without --yes: not a terminal, so nobody can be asked. Nothing was done.`)
    const answer = (await io.ask(`${what}\nType "yes" to go ahead: `)).trim().toLowerCase()
    if (answer !== 'yes' && answer !== 'y') throw new RefusedError('not confirmed; nothing was done')
  }

  const program = new Command('idem')
    .description('Operate idempotency keys: find and clear stuck keys, purge expired ones (the same operations as /admin, recorded in the audit trail).')
    .showHelpAfterError()
    .exitOverride()
    .configureOutput({ writeOut: (text) => io.out(text), writeErr: (text) => io.err(text) })
    // For an app's database, where no server records its settings (operations/context.ts).
    .option('--ttl-seconds <n>', 'the TTL your app runs with, where no server recorded one in the database', seconds)
    .option('--retention-seconds <n>', 'the retention your app runs with, where no server recorded one in the database', seconds)

  const keyFilterOptions = (command: Command) => command
    .option('--tenant <tenant>', 'only this tenant')
    .option('--route <route>', 'only this route, e.g. "POST /api/payments"')
    .option('--key <text>', 'only keys containing this text')

  keyFilterOptions(program.command('list'))
    .description('list keys in processing, stale (older than the TTL) first')
    .option('--stale', 'only stale keys')
    .option('--limit <n>', `how many (at most ${MAX_PAGE_SIZE})`, positiveInt, 50)
    .option('--cursor <cursor>', 'the next page: the cursor a previous list printed')
    .option('--json', 'print JSON, as GET /admin/api/keys answers')
    .action((options: { tenant?: string; route?: string; key?: string; stale?: boolean; limit: number; cursor?: string; json?: boolean }) => withOperations(async (ops) => {
      if (options.limit > MAX_PAGE_SIZE) throw new UsageError(`--limit is at most ${MAX_PAGE_SIZE}`)
      const page = await ops.list(parseKeyFilters(options), { cursor: options.cursor, limit: options.limit })
      if (options.json) return printJson(json.keyPageJson(page))
      if (page.keys.length === 0) print(options.cursor ? 'no more keys' : 'no key in processing matches')
      else table([
        ['STATE', 'TENANT', 'KEY', 'ROUTE', 'AGE', 'ATTEMPTS', 'LEASE'],
        ...page.keys.map((key) => [key.stale ? 'stale' : key.workedOn ? 'running' : 'owner gone', key.tenant, key.key, `${key.method} ${key.path}`, formatAge(key.ageSeconds), String(key.attempts), key.lease]),
      ])
      if (page.nextCursor) print(`more: add --cursor ${page.nextCursor}`)
    }))

  keyFilterOptions(program.command('counts'))
    .description('count keys under the same filters as list: processing, stale, oldest, completed, past retention')
    .option('--json', 'print JSON, as GET /admin/api/counts answers')
    .action((options: { tenant?: string; route?: string; key?: string; json?: boolean }) => withOperations(async (ops) => {
      const counts = await ops.count(parseKeyFilters(options), { withDone: true })
      if (options.json) return printJson(json.countsJson(counts, ops))
      table([
        ['processing', String(counts.processing)],
        [`stale (> ${ops.ttlSeconds}s)`, String(counts.stale)],
        ['oldest processing', counts.oldestProcessingAgeSeconds === null ? '-' : formatAge(counts.oldestProcessingAgeSeconds)],
        ['completed', String(counts.done ?? 0)],
        [`past retention (> ${ops.retentionSeconds}s)`, String(counts.expired)],
      ])
    }))

  program.command('show')
    .description('one key in any state: lease, attempts, owner process, deadline, downstream key, payment')
    .argument('<tenant>', 'the key\'s tenant')
    .argument('<key>', 'the idempotency key')
    .option('--json', 'print JSON, as GET /admin/api/keys/{tenant}/{key} answers')
    .action((tenant: string, key: string, options: { json?: boolean }) => withOperations(async (ops) => {
      const detail = await ops.show(tenant, key)
      if (!detail) throw new RefusedError(`no key ${JSON.stringify(key)} of tenant ${JSON.stringify(tenant)}`)
      if (options.json) return printJson(json.keyDetailJson(detail))
      const time = (date: Date | null) => (date ? formatTime(date) : '-')
      table([
        ['tenant', detail.tenant],
        ['key', detail.key],
        ['status', detail.stale ? 'processing (stale)' : detail.status],
        ['request', `${detail.method} ${detail.path}`],
        ['attempts', String(detail.attempts)],
        ['lease', detail.lease],
        ['lease taken', `${time(detail.lockedAt)} (${formatAge(detail.ageSeconds)} ago)`],
        ['deadline', time(detail.deadline)],
        ['owner', ownerText(detail)],
        ['completed', time(detail.completedAt)],
        ['released', `${time(detail.releasedAt)}${detail.releaseReason ? ` (${detail.releaseReason})` : ''}`],
        ['summary', detail.summary ? visibleBidi(JSON.stringify(detail.summary)) : '-'],
        ['replayed until', time(detail.retentionEndsAt)],
        ['request id', detail.httpRequestId ?? '-'],
        ['execution id', detail.requestId],
        ['downstream key', detail.downstreamKey],
        ['payment', detail.payment ? `${detail.payment.id}: ${detail.payment.amount} ${detail.payment.currency} for ${detail.payment.customer}, charge ${detail.payment.providerReference}` : '-'],
      ])
      print()
      print(previewText(detail))
    }))

  program.command('released')
    .description('keys released after a failed execution, newest first; by default those released after their deadline, whose provider call may have charged (ask the provider with the downstream key)')
    .option('--reason <reason>', `${RELEASE_REASONS.join(', ')} (default: deadline)`)
    .option('--tenant <tenant>', 'only this tenant')
    .option('--limit <n>', `how many (at most ${MAX_PAGE_SIZE})`, positiveInt, 50)
    .option('--cursor <cursor>', 'the next page: the cursor a previous run printed')
    .option('--json', 'print JSON, as GET /admin/api/released answers')
    .action((options: { reason?: string; tenant?: string; limit: number; cursor?: string; json?: boolean }) => withOperations(async (ops) => {
      if (options.limit > MAX_PAGE_SIZE) throw new UsageError(`--limit is at most ${MAX_PAGE_SIZE}`)
      const reason = parseReleaseReason(options.reason)
      const tenant = options.tenant?.trim() || undefined
      const [page, counts] = await Promise.all([ops.listReleased({ reason, tenant }, { cursor: options.cursor, limit: options.limit }), ops.countReleased(tenant)])
      if (options.json) return printJson(json.releasedPageJson(page, counts))
      if (page.keys.length === 0) print(`no key released with reason ${reason}`)
      else table([
        ['RELEASED (UTC)', 'TENANT', 'KEY', 'ATTEMPTS', 'SUMMARY', 'DOWNSTREAM KEY'],
        ...page.keys.map((key) => [formatTime(key.releasedAt), key.tenant, key.key, String(key.attempts), key.summary ? visibleBidi(JSON.stringify(key.summary)) : '-', key.downstreamKey]),
      ])
      if (page.nextCursor) print(`more: add --cursor ${page.nextCursor}`)
    }))

  program.command('expire')
    .description('force-expire one processing key (refused while a live worker holds it within its deadline); asks first unless --yes')
    .argument('<tenant>', 'the key\'s tenant')
    .argument('<key>', 'the idempotency key')
    .option('--lease <lease>', 'act only if the key still has this lease (as listed); default: its current lease', lease)
    .option('--yes', 'do it without asking (needed when not run in a terminal)')
    .option('--dry-run', 'show what it would do, change nothing')
    .option('--actor <name>', 'who you are, noted in the audit trail beside your OS user')
    .option('--json', 'print JSON, as POST /admin/api/keys/expire answers (with --dry-run: the key, as GET /admin/api/keys/{tenant}/{key})')
    .action((tenant: string, key: string, options: { lease?: string; yes?: boolean; dryRun?: boolean; actor?: string; json?: boolean }) => {
      const actor = options.dryRun ? undefined : resolveActor(options.actor, io)
      return withOperations(async (ops) => {
        const detail = await ops.show(tenant, key)
        if (!detail || detail.status !== 'processing') throw new RefusedError(`no key ${JSON.stringify(key)} of tenant ${JSON.stringify(tenant)} is in processing; nothing done`)
        const seen = options.lease ?? detail.lease
        const what = [
          `tenant ${detail.tenant}, key ${detail.key}, ${detail.method} ${detail.path}, lease ${seen}${seen === detail.lease ? '' : ` (its current lease is ${detail.lease}: it would be left alone)`}`,
          `in processing for ${formatAge(detail.ageSeconds)}, attempts ${detail.attempts}; owner: ${ownerText(detail)}`,
          previewText(detail),
        ].map(printable).join('\n')
        if (options.dryRun) {
          if (options.json) return printJson({ dry_run: true, key: json.keyDetailJson(detail) })
          return print(`dry run, nothing done:\n${what}`)
        }
        await confirmed(options.yes, what)
        const result = await ops.forceExpire({ tenant, key, lease: seen }, actor!)
        if (options.json) printJson(json.forceExpireJson(result, seen))
        else print({
          expired: `expired: the key was released (lease ${seen}); the next retry runs the request again, with the same downstream key`,
          worker_alive: 'refused: a live worker holds this key within its deadline and is still processing it; nothing done',
          unchanged: `nothing done: the key completed, was released or changed hands (lease ${seen} is no longer current)`,
        }[result.outcome])
        if (result.outcome !== 'expired') state.exitCode = EXIT.refused
      })
    })

  program.command('expire-stale')
    .description('force-expire every stale processing key; keys whose completion is committing are skipped and listed')
    .option('--tenant <tenant>', 'only this tenant')
    .option('--yes', 'do it without asking (needed when not run in a terminal)')
    .option('--dry-run', 'show which keys it would expire, change nothing')
    .option('--actor <name>', 'who you are, noted in the audit trail beside your OS user')
    .option('--json', 'print JSON, as POST /admin/api/keys/expire-stale answers (with --dry-run: the preview)')
    .action((options: { tenant?: string; yes?: boolean; dryRun?: boolean; actor?: string; json?: boolean }) => {
      const actor = options.dryRun ? undefined : resolveActor(options.actor, io)
      return withOperations(async (ops) => {
        const tenant = parseKeyFilters({ tenant: options.tenant }).tenant
        const preview = await ops.previewExpireStale(tenant)
        const keys = preview.keys.map((key) => `  ${key.tenant} ${key.key} (${formatAge(key.ageSeconds)}, attempts ${key.attempts})`)
        const what = [
          `${preview.stale} key(s) in processing${tenant ? ` of tenant ${tenant}` : ''} are older than the server's TTL (${preview.ttlSeconds}s) at ${formatTime(preview.asOf)}:`,
          ...keys.map(printable),
          ...(preview.stale > keys.length ? [`  and ${preview.stale - keys.length} more`] : []),
          'Expiring releases each one: its client\'s next retry runs the request again, with the same downstream key.',
        ].join('\n')
        if (options.dryRun) {
          if (options.json) return printJson({ dry_run: true, ...json.expireStalePreviewJson(preview) })
          return print(`dry run, nothing done:\n${what}`)
        }
        await confirmed(options.yes, what)
        const result = await ops.expireStale({ asOf: preview.asOf, tenant }, actor!)
        if (options.json) return printJson(json.expireStaleJson(result))
        print(`expired ${result.expired} stale key(s); ${result.workerAlive} skipped because their completion was committing`)
        for (const key of result.aliveKeys) print(printable(`  skipped: ${key.tenant} ${key.key}`))
      })
    })

  program.command('purge')
    .description('delete keys past the server\'s retention now (the server also does this every minute)')
    .option('--yes', 'do it without asking (needed when not run in a terminal)')
    .option('--dry-run', 'show how many keys it would delete, change nothing')
    .option('--actor <name>', 'who you are, noted in the audit trail beside your OS user')
    .option('--json', 'print JSON, as POST /admin/api/purge answers (with --dry-run: the preview)')
    .action((options: { yes?: boolean; dryRun?: boolean; actor?: string; json?: boolean }) => {
      const actor = options.dryRun ? undefined : resolveActor(options.actor, io)
      return withOperations(async (ops) => {
        const preview = await ops.previewPurge()
        const what = [
          `${preview.done} completed and ${preview.released} released key(s) are past the server's retention (${preview.retentionSeconds}s) at ${formatTime(preview.asOf)}.`,
          'A purge would delete them. None of them is replayed any more: a retry with one of them is already a new request.',
        ].join('\n')
        if (options.dryRun) {
          if (options.json) return printJson({ dry_run: true, ...json.purgePreviewJson(preview) })
          return print(`dry run, nothing done:\n${what}`)
        }
        await confirmed(options.yes, what)
        const result = await ops.purge(actor!)
        if (options.json) printJson(json.purgeJson(result))
        else print(`purged ${result.purged} expired key(s)`)
      })
    })

  program.command('audit')
    .description('the audit trail, newest first; with an id, that one entry')
    .argument('[id]', 'one entry\'s id')
    .option('--by <actor>', 'only actors starting with this, e.g. "cli:" or "admin:alice"')
    .option('--action <action>', 'only this action: force_expire, expire_all_stale, purge_expired')
    .option('--tenant <tenant>', 'only this tenant')
    .option('--key <key>', 'only this key (exact)')
    .option('--before <id>', 'the next (older) page: the id a previous audit printed')
    .option('--limit <n>', 'how many entries', positiveInt, 20)
    .option('--json', 'print JSON, as GET /admin/api/audit (or /admin/api/audit/{id}) answers')
    .action((id: string | undefined, options: { by?: string; action?: string; tenant?: string; key?: string; before?: string; limit: number; json?: boolean }) => withOperations(async (ops) => {
      if (id !== undefined) {
        const entry = await ops.auditEntry(id)
        if (!entry) throw new RefusedError(`no audit entry ${id}`)
        if (options.json) return printJson(json.auditJson(entry))
        table([['id', entry.id], ['when', formatTime(entry.at)], ['who', entry.actor], ['action', entry.action], ['tenant', entry.tenant ?? '-'], ['key', entry.key ?? '-'], ['outcome', entry.outcome]])
        print(printable(JSON.stringify(entry.detail ?? {}, null, 2)))
        return
      }
      const filters = parseAuditFilters({ actor: options.by, action: options.action, tenant: options.tenant, key: options.key, before: options.before })
      const page = await ops.audit({ ...filters, limit: options.limit })
      if (options.json) return printJson(json.auditPageJson(page))
      if (page.entries.length === 0) return print('no operator action recorded')
      table([['ID', 'WHEN (UTC)', 'WHO', 'ACTION', 'TENANT', 'KEY', 'OUTCOME'], ...page.entries.map((entry) => [
        entry.id, formatTime(entry.at), entry.actor, entry.action, entry.tenant ?? '', entry.key ?? '', entry.outcome,
      ])])
      if (page.nextBefore) print(`older: add --before ${page.nextBefore}`)
    }))

  return program
}

/** Runs one command line; resolves to the exit code. */
export async function runCli(argv: string[], io: CliIo = processIo): Promise<number> {
  const state: RunState = { exitCode: EXIT.ok }
  try {
    await buildProgram(io, state).parseAsync(argv, { from: 'user' })
    return state.exitCode
  } catch (error) {
    if (error instanceof CommanderError)
      return error.code === 'commander.helpDisplayed' || error.code === 'commander.version' || error.code === 'commander.help' ? EXIT.ok : EXIT.usage
    if (error instanceof UsageError || error instanceof OperationInputError) {
      io.err(`idem: ${error.message}\n`)
      return EXIT.usage
    }
    if (error instanceof RefusedError) {
      io.err(`idem: ${error.message}\n`)
      return EXIT.refused
    }
    io.err(`idem: failed: ${error instanceof Error ? error.message : String(error)}\n`)
    return EXIT.refused
  }
}

if (import.meta.main) process.exit(await runCli(process.argv.slice(2)))
