import { hostname } from 'node:os'
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

export interface ProcessHeartbeat {
  /** This process's id: the `owner` of every key it claims. */
  readonly id: string
  /** Beats once now (the timer beats on its own). */
  beat(): Promise<void>
  /** Stops beating and removes the row: a clean stop is not mistaken for a live owner. */
  stop(): Promise<void>
}

/**
 * Registers this process and keeps its heartbeat fresh. A failed beat (the
 * database away) is retried at the next interval; its keys then look
 * abandoned to operators, which fencing makes safe.
 */
export async function startHeartbeat(sql: Sql, options: { intervalMs?: number; log?: (line: string) => void } = {}): Promise<ProcessHeartbeat> {
  const id = crypto.randomUUID()
  await sql`
    insert into idempotency_processes (id, pid, hostname) values (${id}, ${process.pid}, ${hostname().slice(0, 255) || 'unknown'})`
  // Rows of processes gone for a day are of no use to anyone.
  await sql`delete from idempotency_processes where heartbeat_at < now() - interval '1 day'`.catch(() => undefined)
  let failing = false
  const beat = async () => {
    try {
      await sql`update idempotency_processes set heartbeat_at = now() where id = ${id}`
      if (failing) options.log?.('heartbeat: written again')
      failing = false
    } catch (error) {
      if (!failing) options.log?.(`heartbeat failed: ${error instanceof Error ? error.message : String(error)}`)
      failing = true
    }
  }
  const timer = setInterval(() => void beat(), options.intervalMs ?? HEARTBEAT_INTERVAL_MS)
  timer.unref?.()
  return {
    id,
    beat,
    async stop() {
      clearInterval(timer)
      await sql`delete from idempotency_processes where id = ${id}`.catch(() => undefined)
    },
  }
}
