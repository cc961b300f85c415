#!/usr/bin/env bun
/**
 * The operator CLI: `npm run idem -- <command>` or `idem <command>`.
 * It calls the same core operations as the admin page (and writes the same
 * audit trail, as "cli:<os user>").
 *
 * Exit codes: 0 done; 1 refused or failed (a live worker holds the key, the key
 * changed, the database failed); 2 usage (bad arguments, DATABASE_URL unset).
 */
import { userInfo } from 'node:os'
import { Command, CommanderError, InvalidArgumentError } from 'commander'
import postgres from 'postgres'
import { expireStaleAction, forceExpireAction, purgeAction, type ActionContext } from './admin/actions'
import { parseFilters } from './admin/query'
import { formatAge } from './admin/format'
import { listAudit } from './core/audit'
import { countKeys } from './core/counts'
import { listProcessing, MAX_PAGE_SIZE } from './core/list-processing'
import { readServerSettings, type ServerSettings } from './core/settings'

const EXIT = { ok: 0, refused: 1, usage: 2 } as const

class UsageError extends Error {}
class RefusedError extends Error {}

function actor(): string {
  let name = process.env.USER ?? 'unknown'
  try {
    name = userInfo().username
  } catch {
    // no passwd entry (containers): keep $USER
  }
  return `cli:${name}`.slice(0, 128)
}

/**
 * The TTL and retention the server runs with, as it recorded them at start.
 * Never the operator's shell: `IDEMPOTENCY_RETENTION_SECONDS=1 idem purge`
 * once deleted keys the service still replays, and the next retry paid twice.
 */
async function serverSettings(sql: Parameters<typeof readServerSettings>[0]): Promise<ServerSettings> {
  const settings = await readServerSettings(sql)
  if (!settings) throw new RefusedError('no server has recorded its settings in this database yet: start the service once, so that operator commands apply its TTL and retention')
  for (const [name, value] of [['IDEMPOTENCY_TTL_SECONDS', settings.ttlSeconds], ['IDEMPOTENCY_RETENTION_SECONDS', settings.retentionSeconds]] as const) {
    const mine = process.env[name]
    if (mine && mine.trim() !== String(value)) process.stderr.write(`idem: ignoring ${name}=${mine} from this shell: the server runs with ${value}\n`)
  }
  return settings
}

function positiveInt(value: string): number {
  if (!/^\d{1,4}$/.test(value) || Number(value) < 1) throw new InvalidArgumentError('must be a whole number ≥ 1')
  return Number(value)
}

function lease(value: string): string {
  if (!/^[1-9]\d{0,18}$/.test(value)) throw new InvalidArgumentError('must be a lease number as listed')
  return value
}

async function withDatabase<T>(work: (context: ActionContext, sql: postgres.Sql) => Promise<T>): Promise<T> {
  const url = process.env.DATABASE_URL?.trim()
  if (!url) throw new UsageError('DATABASE_URL is not set: point it at the service\'s database, e.g. DATABASE_URL=postgres://user@host:5432/db')
  if (!/^postgres(ql)?:\/\//.test(url)) throw new UsageError('DATABASE_URL must be a postgres:// or postgresql:// URL')
  const sql = postgres(url, {
    max: 2,
    connect_timeout: 5,
    onnotice: () => undefined,
    // Same guards as the server's pools: nothing of ours waits long on a lock.
    connection: { application_name: 'idempotent-post:cli', statement_timeout: 30_000, lock_timeout: 1_000 },
  })
  try {
    const settings = await serverSettings(sql as never)
    return await work({ sql: sql as never, ttlSeconds: settings.ttlSeconds, retentionSeconds: settings.retentionSeconds }, sql)
  } finally {
    await sql.end({ timeout: 5 })
  }
}

function print(line = ''): void {
  process.stdout.write(`${line}\n`)
}
const printJson = (value: unknown): void => print(JSON.stringify(value, null, 2))

/** Columns padded to their widest cell; keys are printable ASCII (a table CHECK), so nothing here can move the cursor. */
function table(rows: string[][]): void {
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)))
  for (const row of rows) print(row.map((cell, column) => cell.padEnd(widths[column]!)).join('  ').trimEnd())
}

export function buildProgram(): Command {
  const program = new Command('idem')
    .description('Operate idempotency keys: find and clear stuck keys, purge expired ones (same actions as /admin, recorded in the audit trail).')
    .showHelpAfterError()
    .exitOverride()

  program.command('list')
    .description('list keys in processing, stale (older than the TTL) first')
    .option('--tenant <tenant>', 'only this tenant')
    .option('--route <route>', 'only this route, e.g. "POST /api/payments"')
    .option('--stale', 'only stale keys')
    .option('--limit <n>', `how many (at most ${MAX_PAGE_SIZE})`, positiveInt, 50)
    .option('--json', 'machine-readable output')
    .action((options: { tenant?: string; route?: string; stale?: boolean; limit: number; json?: boolean }) => withDatabase(async (context) => {
      const filters = parseFilters(new URLSearchParams({ ...(options.tenant ? { tenant: options.tenant } : {}), ...(options.route ? { route: options.route } : {}) }))
      if (!filters.ok) throw new UsageError(filters.error)
      const page = await listProcessing(context.sql, { ttlSeconds: context.ttlSeconds, tenant: filters.value.tenant, method: filters.value.method, path: filters.value.path, staleOnly: options.stale, limit: Math.min(options.limit, MAX_PAGE_SIZE) })
      if (options.json) return printJson(page.keys.map((key) => ({ ...key, ageSeconds: Math.floor(key.ageSeconds) })))
      if (page.keys.length === 0) return print('no key in processing matches')
      table([
        ['STATE', 'TENANT', 'KEY', 'ROUTE', 'AGE', 'ATTEMPTS', 'LEASE'],
        ...page.keys.map((key) => [key.stale ? 'stale' : 'running', key.tenant, key.key, `${key.method} ${key.path}`, formatAge(key.ageSeconds), String(key.attempts), key.lease]),
      ])
      if (page.next) print(`(more: narrow with --tenant/--route/--stale or raise --limit)`)
    }))

  program.command('expire')
    .description('force-expire one processing key (refused while a live worker holds it)')
    .argument('<tenant>', 'the key\'s tenant')
    .argument('<key>', 'the idempotency key')
    .option('--lease <lease>', 'act only if the key still has this lease (as listed); default: its current lease', lease)
    .option('--json', 'machine-readable output')
    .action((tenant: string, key: string, options: { lease?: string; json?: boolean }) => withDatabase(async (context, sql) => {
      let seen = options.lease
      if (seen === undefined) {
        const [row] = await sql<{ lease: string }[]>`select lease from idempotency_keys where tenant = ${tenant} and key = ${key} and status = 'processing'`
        if (!row) throw new RefusedError(`no key ${JSON.stringify(key)} of tenant ${JSON.stringify(tenant)} is in processing; nothing done`)
        seen = row.lease
      }
      const result = await forceExpireAction(context, { tenant, key, lease: seen }, actor())
      if (options.json) printJson({ outcome: result.outcome, lease: seen, audit_id: result.auditId })
      else print({
        expired: `expired: key deleted (lease ${seen}); the next retry runs afresh`,
        worker_alive: `refused: a live worker holds this key and is still processing it; nothing done`,
        unchanged: `nothing done: the key completed, was released or changed hands (lease ${seen} is no longer current)`,
      }[result.outcome])
      if (result.outcome !== 'expired') process.exitCode = EXIT.refused
    }))

  program.command('expire-stale')
    .description('force-expire every stale processing key; keys held by live workers are skipped and reported')
    .option('--tenant <tenant>', 'only this tenant')
    .option('--yes', 'really do it (without it, only show how many would be expired)')
    .option('--json', 'machine-readable output')
    .action((options: { tenant?: string; yes?: boolean; json?: boolean }) => withDatabase(async (context) => {
      if (!options.yes) {
        const page = await listProcessing(context.sql, { ttlSeconds: context.ttlSeconds, tenant: options.tenant, staleOnly: true, limit: MAX_PAGE_SIZE })
        print(`${page.keys.length}${page.next ? '+' : ''} stale key(s) would be expired; run again with --yes to do it`)
        process.exitCode = EXIT.usage
        return
      }
      const result = await expireStaleAction(context, { tenant: options.tenant }, actor())
      if (options.json) return printJson(result)
      print(`expired ${result.expired} stale key(s); ${result.workerAlive} skipped because a live worker holds them`)
      for (const key of result.aliveKeys) print(`  worker alive: ${key.tenant} ${key.key}`)
    }))

  program.command('purge')
    .description('delete completed keys past the server\'s retention now (the server also does this every minute)')
    .option('--json', 'machine-readable output')
    .action((options: { json?: boolean }) => withDatabase(async (context) => {
      const result = await purgeAction(context, actor())
      if (options.json) printJson({ purged: result.purged, audit_id: result.auditId })
      else print(`purged ${result.purged} expired key(s)`)
    }))

  program.command('counts')
    .description('count keys: processing, stale, completed, past retention')
    .option('--json', 'machine-readable output')
    .action((options: { json?: boolean }) => withDatabase(async (context) => {
      const counts = await countKeys(context.sql, { ttlSeconds: context.ttlSeconds, retentionSeconds: context.retentionSeconds, withDone: true })
      if (options.json) return printJson(counts)
      table([
        ['processing', String(counts.processing)],
        [`stale (> ${context.ttlSeconds}s)`, String(counts.stale)],
        ['oldest processing', counts.oldestProcessingAgeSeconds === null ? '-' : formatAge(counts.oldestProcessingAgeSeconds)],
        ['completed', String(counts.done ?? 0)],
        [`past retention (> ${context.retentionSeconds}s)`, String(counts.expired)],
      ])
    }))

  program.command('audit')
    .description('show the audit trail, newest first')
    .option('--limit <n>', 'how many entries', positiveInt, 20)
    .option('--json', 'machine-readable output')
    .action((options: { limit: number; json?: boolean }) => withDatabase(async (context) => {
      const entries = await listAudit(context.sql, { limit: options.limit })
      if (options.json) return printJson(entries)
      if (entries.length === 0) return print('no operator action recorded yet')
      table([['WHEN (UTC)', 'WHO', 'ACTION', 'TENANT', 'KEY', 'OUTCOME'], ...entries.map((entry) => [
        entry.at.toISOString().slice(0, 19).replace('T', ' '), entry.actor, entry.action, entry.tenant ?? '', entry.key ?? '', entry.outcome,
      ])])
    }))

  return program
}

export async function runCli(argv: string[]): Promise<number> {
  process.exitCode = 0
  try {
    await buildProgram().parseAsync(argv, { from: 'user' })
    return Number(process.exitCode ?? 0)
  } catch (error) {
    if (error instanceof CommanderError)
      return error.code === 'commander.helpDisplayed' || error.code === 'commander.version' ? EXIT.ok : EXIT.usage
    if (error instanceof UsageError) {
      process.stderr.write(`idem: ${error.message}\n`)
      return EXIT.usage
    }
    if (error instanceof RefusedError) {
      process.stderr.write(`idem: ${error.message}\n`)
      return EXIT.refused
    }
    process.stderr.write(`idem: failed: ${error instanceof Error ? error.message : String(error)}\n`)
    return EXIT.refused
  }
}

if (import.meta.main) process.exit(await runCli(process.argv.slice(2)))
