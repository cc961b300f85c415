import { hostname } from 'node:os'
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

export interface ProcessHeartbeat {
  /** This process's id: the `owner` of every key it claims. */
  readonly id: string
  /** Beats once now (the timer beats on its own); never two at once. */
  beat(): Promise<void>
  /** Stops beating and removes the row: a clean stop is not mistaken for a live owner. */
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
  await sql`
    insert into idempotency_processes (id, pid, hostname, schema_known)
    values (${id}, ${process.pid}, ${hostname().slice(0, 255) || 'unknown'}, ${options.schemaKnown ? JSON.stringify(options.schemaKnown) : null}::jsonb)`
  // Rows of processes gone for a day are of no use to anyone.
  await sql`delete from idempotency_processes where heartbeat_at < now() - interval '1 day'`.catch(() => undefined)
  let failing = false
  let stopped = false
  let running: Promise<void> = Promise.resolve()
  let timer: ReturnType<typeof setTimeout> | undefined
  const write = async () => {
    try {
      const leases = pgTextArray(options.leases?.() ?? [])
      await sql`
        update idempotency_processes
           set leases = ${leases}::bigint[], leases_as_of = heartbeat_at, heartbeat_at = now()
         where id = ${id}`
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
      await sql`delete from idempotency_processes where id = ${id}`.catch(() => undefined)
    },
  }
}
