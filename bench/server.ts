/**
 * The PostgreSQL server a bench run measures on, and its databases.
 *
 * By default the bench's own embedded cluster (.data/bench-pg, port 54349),
 * the server `npm start` gives a new user, with pg_stat_statements loaded (a
 * private cluster may be restarted for it) and every postgres process of it
 * counted for CPU: backends, WAL writer, checkpointer, autovacuum. With
 * DATABASE_URL, that server instead: only the backends of the run's own
 * databases are counted, and pg_stat_statements is read only if the server
 * already loads it (not ours to restart).
 */
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { startEmbedded, type EmbeddedPostgres } from '../src/store/embedded'
import { migrateService } from '../src/store/migrate'
import { cpuMicros } from './cpu'

const BENCH_EMBEDDED_PORT = 54349
const BENCH_EMBEDDED_DIR = '.data/bench-pg'

export interface BenchServer {
  /** The server's own URL (database `postgres`). */
  readonly base: string
  readonly version: string
  /** True for the bench's own cluster: every one of its processes is counted. */
  readonly private: boolean
  readonly statements: boolean
  urlOf(database: string): string
  /** A new database: empty, or a copy of `template`. */
  create(name: string, template?: string): Promise<string>
  /** A template migrated to this checkout's schema, filled by `fill` if given; made once per run and name. */
  template(name: string, fill?: (sql: postgres.Sql) => Promise<void>): Promise<string>
  drop(name: string): Promise<void>
  /** CPU (µs) of the server's processes: all of them (private), or the backends of `database`. */
  cpu(database: string): Promise<Map<number, number>>
  stop(): Promise<void>
}

export async function openBenchServer(log: (line: string) => void): Promise<BenchServer> {
  let embedded: EmbeddedPostgres | undefined
  let base = process.env.DATABASE_URL
  if (!base) {
    embedded = await startEmbedded({ dir: BENCH_EMBEDDED_DIR, port: BENCH_EMBEDDED_PORT, log })
    if (process.env.BENCH_PG_STAT_STATEMENTS !== '0') embedded = await withStatementStats(embedded, log)
    base = embedded.url
  }
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  const [row] = await admin<{ version: string; loaded: boolean }[]>`
    select current_setting('server_version') as version, current_setting('shared_preload_libraries') ~ 'pg_stat_statements' as loaded`
  const urlOf = (database: string) => {
    const url = new URL(base)
    url.pathname = `/${database}`
    return url.toString()
  }
  const made = new Set<string>()
  const templates = new Map<string, Promise<string>>()
  const postmaster = embedded ? Number(readFileSync(join(embedded.dir, 'postmaster.pid'), 'utf8').split('\n')[0]) : undefined
  const server: BenchServer = {
    base,
    version: row!.version,
    private: embedded !== undefined,
    statements: row!.loaded,
    urlOf,
    async create(name, template) {
      await admin.unsafe(`create database "${name}"${template ? ` template "${template}"` : ''}`)
      made.add(name)
      if (template) await settle(admin, log)
      return urlOf(name)
    },
    template(name, fill) {
      let made = templates.get(name)
      if (!made) {
        made = (async () => {
          const url = await server.create(name)
          await migrateService(url)
          if (fill) {
            const sql = postgres(url, { max: 1, onnotice: () => undefined })
            try {
              await fill(sql)
              await sql`vacuum analyze`
            } finally {
              await sql.end()
            }
          }
          return name
        })()
        templates.set(name, made)
      }
      return made
    },
    async drop(name) {
      await admin.unsafe(`drop database if exists "${name}" with (force)`)
      made.delete(name)
    },
    async cpu(database) {
      const pids = postmaster !== undefined ? childrenOf(postmaster) : (await admin<{ pid: number }[]>`
        select pid from pg_stat_activity where datname = ${database} and pid <> pg_backend_pid()`).map((r) => r.pid)
      return new Map(pids.map((pid) => [pid, cpuMicros(pid)]))
    },
    async stop() {
      for (const name of [...made]) await server.drop(name).catch(() => undefined)
      await admin.end()
      await embedded?.stop()
    },
  }
  return server
}

let unsettled = false

/**
 * A copy of a template is written through the WAL (CREATE DATABASE's
 * WAL_LOG strategy, PostgreSQL 15+): a copy of the 1,000,000-key template
 * logged about 530 MB, which set off a checkpoint that wrote the copy back
 * for the next 11 s, through the round measured on it, its CPU counted as
 * the service's and its disk writes beside every commit's flush (postgres.log
 * of the 2026-12-05 run: "checkpoint starting: wal" in each 1M round). A
 * CHECKPOINT here writes the copy back before the round starts, so every
 * round begins with the server at rest. It needs a superuser or
 * pg_checkpoint; on a server given in DATABASE_URL without either, the
 * rounds run as before (said once).
 */
async function settle(admin: postgres.Sql, log: (line: string) => void): Promise<void> {
  try {
    await admin.unsafe('checkpoint')
  } catch (error) {
    if (!unsettled) log(`no CHECKPOINT after copying a template (${(error as Error).message}): a round may run beside the copy's write-back`)
    unsettled = true
  }
}

/** The postmaster and its children (Linux /proc). */
function childrenOf(postmaster: number): number[] {
  const pids = [postmaster]
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8')
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      if (ppid === postmaster) pids.push(Number(entry))
    } catch { /* gone meanwhile */ }
  }
  return pids
}

/** CPU µs spent between two readings of `cpu()`: processes that ended in between count what they had. */
export function cpuSpent(before: Map<number, number>, after: Map<number, number>): number {
  let total = 0
  for (const [pid, now] of after) if (!Number.isNaN(now)) total += now - (before.get(pid) ?? 0)
  return total
}

/**
 * pg_stat_statements in the bench's own cluster: set once with ALTER SYSTEM
 * (kept in its data directory for later runs) and the server restarted.
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
  log('restarting the bench\'s PostgreSQL with pg_stat_statements loaded')
  await embedded.stop()
  return startEmbedded({ dir: BENCH_EMBEDDED_DIR, port: BENCH_EMBEDDED_PORT, log })
}
