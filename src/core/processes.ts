import { hostname } from 'node:os'
import { requestPathForm } from './citus-form'
import { pgTextArray } from './pg-array'
import type { Sql } from './types'

/**
 * How often a server process writes its heartbeat: one UPDATE of one row per
 * process, whatever its traffic, never one per key.
 */
export const HEARTBEAT_INTERVAL_MS = 2_000
/**
 * A process whose heartbeat is older than this is taken for gone: five missed
 * beats, so a process paused by a busy machine (GC, CPU starvation, a slow
 * database) is not declared dead, and one SIGKILLed is noticed within ~10 s.
 */
export const PROCESS_ALIVE_SECONDS = 10

/** SQL condition: the owner of key row `k` has a recent heartbeat (or none is recorded, so we must assume it lives). */
export function ownerAliveCondition(sql: Sql, now: Date | null | undefined) {
  return sql`(k.owner is null or exists (
    select 1 from idempotency_processes p
     where p.id = k.owner
       and p.heartbeat_at > coalesce(${now ?? null}::timestamptz, now()) - make_interval(secs => ${PROCESS_ALIVE_SECONDS})))`
}

/** SQL condition: the process row `p` has a recent heartbeat (the migration runner counts the live processes). */
export function processAlive(sql: Sql) {
  return sql`p.heartbeat_at > now() - make_interval(secs => ${PROCESS_ALIVE_SECONDS})`
}

/**
 * How many live processes run the retention purge, which share one
 * connection's time among them: those with a fresh heartbeat that did not say
 * they beat without one (`purges` false). A process of an earlier release, or
 * one that does not say, counts as purging. With the longest retention a live
 * process keeps keys for (keptRetentionSeconds).
 */
export async function purgingProcessCount(sql: Sql): Promise<{ purgers: number; longestRetention: number | null }> {
  const [row] = await sql<{ n: number; longest: number | null }[]>`
    select (select count(*)::int from idempotency_processes p where ${processAlive(sql)} and p.purges is not false) as n,
           ${longestRetention(sql)} as longest`
  return { purgers: row?.n ?? 0, longestRetention: row?.longest ?? null }
}

/**
 * SQL: the longest retention a process's heartbeat says, or null, of the live
 * processes and of those gone less than their retention ago. A process that
 * stopped (scaled to zero, down for a deploy) or died promised to replay the
 * keys it completed until its last beat: those stay theirs until then plus
 * its retention, whether it runs meanwhile or not. A row's last beat is at
 * most PROCESS_ALIVE_SECONDS before it died (a clean stop dates it so).
 */
function longestRetention(sql: Sql) {
  return sql`(select max(p.retention_seconds)::int from idempotency_processes p
               where p.heartbeat_at > now() - make_interval(secs => p.retention_seconds::float8 + ${PROCESS_ALIVE_SECONDS}))`
}

/** Whose turn it is to purge, as one process sees it (purgeTurn). */
export interface PurgeTurn {
  /** This process runs the purge; the others stand by. */
  readonly leads: boolean
  /** The purges running at once, this one included, when it leads: it and the processes that do not say whether they purge (an earlier release's, or an app's heartbeat without `purges`), which share by count. */
  readonly purgers: number
  /** The longest retention a process said it keeps keys for (its heartbeat's), live or gone less than that ago; null when none said. */
  readonly longestRetention: number | null
}

/**
 * Whether process `id` runs the retention purge now. The processes that said
 * they purge (`purges` true) take turns: the oldest live one runs the purge at
 * the whole fifth, and the others stand by until its heartbeat goes (a clean
 * stop removes it at once, a SIGKILL is seen after PROCESS_ALIVE_SECONDS).
 * Two purges at once cleared 0.7x to 0.92x what one clears (BENCHMARKS.md):
 * they delete from the same oldest pages. The oldest, not any, so that a process
 * that starts does not take the turn from one in the middle of a backlog.
 * When none is live (this process's own heartbeat failing), it purges.
 */
export async function purgeTurn(sql: Sql, id: string): Promise<PurgeTurn> {
  const [row] = await sql<{ leader: string | null; unsaid: number; longest: number | null }[]>`
    select (select p.id::text from idempotency_processes p where ${processAlive(sql)} and p.purges
             order by p.started_at, p.id limit 1) as leader,
           (select count(*)::int from idempotency_processes p where ${processAlive(sql)} and p.purges is null and p.id <> ${id}::uuid) as unsaid,
           ${longestRetention(sql)} as longest`
  const leads = row?.leader == null || row.leader === id
  return { leads, purgers: leads ? 1 + (row?.unsaid ?? 0) : 0, longestRetention: row?.longest ?? null }
}

/**
 * The retention a purge deletes keys past: `retentionSeconds` (this process's,
 * or the one the server recorded for an operator), or the longest a live
 * process keeps keys for, if longer. Processes with different retentions on
 * one database (a gateway beside the service, two apps on the plugin) share
 * one key table, and each one's claims replay a key for as long as its own
 * retention says: a purge by the shorter deleted the others' keys while they
 * still promised to replay them, and their next retry paid again. Keys then
 * stay as long as the longest says, also while the process that says it is
 * stopped (longestRetention); each claim still judges by its own.
 * Processes of earlier releases, and apps whose heartbeat does not say, are
 * not known: give them the same retention.
 */
export function keptRetentionSeconds(retentionSeconds: number, longestRetention: number | null): number {
  return Math.max(retentionSeconds, longestRetention ?? 0)
}

/** keptRetentionSeconds, with the processes' retentions read now. */
export async function readKeptRetentionSeconds(sql: Sql, retentionSeconds: number): Promise<number> {
  const [row] = await sql<{ longest: number | null }[]>`select ${longestRetention(sql)} as longest`
  return keptRetentionSeconds(retentionSeconds, row?.longest ?? null)
}

export interface ProcessHeartbeat {
  /** This process's id: the `owner` of every key it claims. */
  readonly id: string
  /** Beats once now (the timer beats on its own); never two at once. */
  beat(): Promise<void>
  /**
   * Stops beating: the row is at once taken for gone (a clean stop is not
   * mistaken for a live owner), and removed, unless it said a retention that
   * the purges must still keep (longestRetention).
   */
  stop(): Promise<void>
}

export interface HeartbeatOptions {
  readonly intervalMs?: number
  readonly log?: (line: string) => void
  /** The leases this process works on right now, listed with every beat. @default none */
  readonly leases?: () => readonly string[]
  /**
   * Every migration line's version this process's code knows ({"engine": 7,
   * "service": 5}): a contract step of the schema waits until no live process
   * is left that does not know what it requires (store/migrate.ts). A process
   * that does not say counts as knowing none. @default unsaid
   */
  readonly schemaKnown?: Readonly<Record<string, number>>
  /**
   * Whether this process runs the retention purge (startRetentionPurge). The
   * purges share a quarter of a connection among the processes that run one: a
   * process that beats without a purge says `false`, or it takes a part of
   * that quarter it never uses. @default unsaid, counted as purging
   */
  readonly purges?: boolean
  /**
   * How long this process's routes replay a completed key (their
   * retentionSeconds): a purge of any process on the database keeps keys at
   * least that long (keptRetentionSeconds). @default unsaid
   */
  readonly retentionSeconds?: number
}

/** The heartbeat's row, as this process writes it. */
interface ProcessRow {
  readonly id: string
  readonly pid: number
  readonly hostname: string
  readonly schemaKnown: string | null
  readonly purges: boolean | null
  readonly retentionSeconds: number | null
}

/**
 * Registers this process and keeps its heartbeat fresh, with the list of
 * leases it works on. Beats are sequential (the next is timed from the end of
 * the last), which `leases_as_of` relies on: a claim that began before the
 * previous beat ran was registered before this beat's list was taken.
 *
 * A failed beat (the database away) is retried at the next interval; its keys
 * then look abandoned to operators, which fencing makes safe.
 */
export async function startHeartbeat(sql: Sql, options: HeartbeatOptions = {}): Promise<ProcessHeartbeat> {
  const id = crypto.randomUUID()
  const row: ProcessRow = {
    id, pid: process.pid, hostname: hostname().slice(0, 255) || 'unknown',
    schemaKnown: options.schemaKnown ? JSON.stringify(options.schemaKnown) : null, purges: options.purges ?? null,
    // A whole number of seconds within the column's range, or unsaid: a retention the row cannot hold never fails the start.
    retentionSeconds: options.retentionSeconds !== undefined && options.retentionSeconds > 0 ? Math.min(Math.ceil(options.retentionSeconds), 2 ** 31 - 1) : null,
  }
  const onEveryNode = await requestPathForm(sql) === 'functions'
  if (onEveryNode) await beatOnEveryNode(sql, row, [])
  else await sql`
    insert into idempotency_processes (id, pid, hostname, schema_known, purges, retention_seconds)
    values (${row.id}, ${row.pid}, ${row.hostname}, ${row.schemaKnown}::jsonb, ${row.purges}::boolean, ${row.retentionSeconds}::int)`
  // Rows of processes gone for a day, and past the retention they said, are of no use to anyone.
  await sql`
    delete from idempotency_processes
     where heartbeat_at < now() - interval '1 day'
       and heartbeat_at < now() - make_interval(secs => coalesce(retention_seconds, 0)::float8 + ${PROCESS_ALIVE_SECONDS})`.catch(() => undefined)
  let failing = false
  let stopped = false
  let running: Promise<void> = Promise.resolve()
  let timer: ReturnType<typeof setTimeout> | undefined
  const write = async () => {
    try {
      if (onEveryNode) {
        await beatOnEveryNode(sql, row, options.leases?.() ?? [])
      } else {
        const leases = pgTextArray(options.leases?.() ?? [])
        await sql`
          update idempotency_processes
             set leases = ${leases}::bigint[], leases_as_of = heartbeat_at, heartbeat_at = now()
           where id = ${id}`
      }
      if (failing) options.log?.('heartbeat: written again')
      failing = false
    } catch (error) {
      if (!failing) options.log?.(`heartbeat failed: ${error instanceof Error ? error.message : String(error)}`)
      failing = true
    }
  }
  const beat = (): Promise<void> => {
    running = running.then(write)
    return running
  }
  const schedule = () => {
    if (stopped) return
    timer = setTimeout(() => void beat().then(schedule), options.intervalMs ?? HEARTBEAT_INTERVAL_MS)
    timer.unref?.()
  }
  schedule()
  return {
    id,
    beat,
    async stop() {
      stopped = true
      clearTimeout(timer)
      await running
      // Its keys are taken for abandoned at once either way. A row that says a retention stays, its last beat dated
      // PROCESS_ALIVE_SECONDS back (gone to every reader, of this release and the ones before), so that the purges
      // keep the keys it completed until now plus its retention (longestRetention); stopped_at says when it stopped
      // to operators (operations/show.ts), since the beat no longer does.
      const kept = row.retentionSeconds !== null
      if (onEveryNode) {
        const gone = kept ? `update %s set heartbeat_at = now() - interval '${PROCESS_ALIVE_SECONDS} seconds', stopped_at = now(), leases = '{}' where id = %L` : 'delete from %s where id = %L'
        await onPlacements(sql, sql`format(${gone}, '%s', ${id}::text)`).catch(() => undefined)
      } else if (kept) {
        await sql`
          update idempotency_processes set heartbeat_at = now() - make_interval(secs => ${PROCESS_ALIVE_SECONDS}), stopped_at = now(), leases = '{}'
           where id = ${id}`.catch(() => undefined)
      } else {
        await sql`delete from idempotency_processes where id = ${id}`.catch(() => undefined)
      }
    },
  }
}

/**
 * Citus: idempotency_processes is a reference table (a copy on every node:
 * a claim routed to a worker reads it there, policy.ts workedOn). A write to
 * it through Citus needs every node, so while one node was down every
 * heartbeat failed, and after 10 s every live process looked gone on the
 * healthy nodes too: their keys could be taken over while their requests ran.
 * So each beat writes each node's copy on its own (run_command_on_placements,
 * no two-phase commit): a node that is down misses the beats, and only its
 * own tenants, which it does not serve meanwhile, see them late. Each copy
 * gets the whole row (an upsert): a node that missed the first beat gets it
 * at the next, and heartbeat_at is each node's own now(), the clock the claims
 * routed there judge it by. Fails only when no copy took the beat.
 */
async function beatOnEveryNode(sql: Sql, row: ProcessRow, leases: readonly string[]): Promise<void> {
  // run_command_on_placements puts the copy's name for every %s of the text: the host name must bring none.
  await onPlacements(sql, sql`format(
    'insert into %s as p (id, pid, hostname, schema_known, purges, retention_seconds, leases) values (%L, %L, %L, %L::jsonb, %L::boolean, %L::int, %L::bigint[])
     on conflict (id) do update set leases = excluded.leases, leases_as_of = p.heartbeat_at, heartbeat_at = now()',
    '%s', ${row.id}::text, ${row.pid}::text, ${row.hostname.replaceAll('%', '_')}::text, ${row.schemaKnown}::text,
    ${row.purges === null ? null : String(row.purges)}::text, ${row.retentionSeconds === null ? null : String(row.retentionSeconds)}::text, ${pgTextArray(leases)}::text)`)
}

/** How long a node may take to accept the heartbeat's connection: a stopped one refuses at once, a hung one would hold the beat for citus.node_connection_timeout (30 s). */
const NODE_CONNECT_TIMEOUT_MS = 1_000

/** Runs `command` (a SQL expression yielding the statement, `%s` for the copy) on every copy of idempotency_processes; throws when none took it. */
async function onPlacements(sql: Sql, command: ReturnType<Sql>): Promise<void> {
  const run = async (tx: Sql) => {
    await tx.unsafe(`set local citus.node_connection_timeout = ${NODE_CONNECT_TIMEOUT_MS}`)
    return tx<{ success: boolean; result: string }[]>`select success, result from run_command_on_placements('idempotency_processes', ${command})`
  }
  const rows = 'begin' in sql ? await sql.begin(run) : await run(sql)
  if (!rows.some((row) => row.success)) throw new Error(`no node took the heartbeat: ${rows.map((row) => row.result).join('; ')}`)
}
