import { Gauge, type Registry } from 'prom-client'
import type postgres from 'postgres'
import { errorText, log as processLog, type Logger } from '../log'

/**
 * Whether the database acknowledges a commit before any standby has it.
 *
 * Then a failover loses what clients were answered 2xx for, and worse: a
 * lost claim takes its downstream idempotency key with it, so the client's
 * retry charges the customer a second time (docs/how-to/ha-patroni.md, the
 * asynchronous run of test/scale/failover.scale.ts). The service cannot fix
 * that, but it can say so: a warning at start and on every change, and the
 * gauge `idempotency_database_commit_unreplicated` (1 = acknowledged commits
 * may be lost at failover), which an alert can watch.
 *
 * Read from the service's own session, so per-role or per-database settings
 * (`ALTER ROLE ... SET synchronous_commit = off`) count:
 * - `synchronous_commit` off or local: no standby is waited for;
 * - `synchronous_standby_names` empty: none is named, so none is waited for
 *   (Patroni's non-strict synchronous mode empties it while no replica is
 *   healthy, which is why this is checked again every interval).
 * remote_write, on and remote_apply wait for a named standby (remote_write:
 * it has the commit in memory, lost only if both hosts crash).
 */
export interface Durability {
  readonly unreplicated: boolean
  readonly synchronousCommit: string
  readonly synchronousStandbyNames: string
  /** The sentence logged when unreplicated. */
  readonly reason?: string
}

export const COMMIT_UNREPLICATED_METRIC = 'idempotency_database_commit_unreplicated'
/** 30 s: Patroni changes synchronous_standby_names within a loop of a replica going away; an alert needs no finer grain. */
export const DURABILITY_CHECK_INTERVAL_MS = 30_000

export async function readDurability(sql: postgres.Sql<any>): Promise<Durability> {
  const [row] = await sql<{ commit: string; standbys: string }[]>`
    select current_setting('synchronous_commit') as commit, current_setting('synchronous_standby_names') as standbys`
  const synchronousCommit = row!.commit
  const synchronousStandbyNames = row!.standbys.trim()
  const reason = synchronousCommit === 'off' || synchronousCommit === 'local'
    ? `synchronous_commit = ${synchronousCommit}: commits are acknowledged before any standby has them`
    : synchronousStandbyNames === ''
      ? 'synchronous_standby_names is empty: commits are acknowledged before any standby has them'
      : undefined
  return { unreplicated: reason !== undefined, synchronousCommit, synchronousStandbyNames, ...(reason ? { reason } : {}) }
}

export interface DurabilityWatch {
  /** The last reading, undefined until the first one succeeded. */
  readonly current: Durability | undefined
  stop(): void
}

export interface DurabilityWatchOptions {
  readonly sql: postgres.Sql<any>
  readonly registry: Registry
  readonly log?: Logger
  /** @default DURABILITY_CHECK_INTERVAL_MS */
  readonly intervalMs?: number
  /**
   * The service's own embedded PostgreSQL: one node with no standby to fail
   * over to, so there is nothing to warn about (the gauge still says 1).
   */
  readonly singleNode?: boolean
}

/**
 * Reads the durability at once (the start-up warning) and every interval,
 * logging when it changes, into the gauge. A failed read (the database is
 * away) keeps the last value: readiness reports the outage, this only the
 * replication settings.
 */
export function watchDurability(options: DurabilityWatchOptions): DurabilityWatch {
  const log = options.log ?? processLog
  const gauge = new Gauge({
    name: COMMIT_UNREPLICATED_METRIC,
    help: '1 when the database acknowledges commits before any standby has them (synchronous_commit off or local, or no synchronous_standby_names): a failover may lose answered payments.',
    registers: [options.registry],
    // WORKERS>1: every worker reads the same database; the sum would count it once per worker.
    aggregator: 'max',
  })
  let current: Durability | undefined
  let reading = false
  const check = async () => {
    if (reading) return
    reading = true
    try {
      const next = await readDurability(options.sql)
      if (next.unreplicated !== current?.unreplicated) {
        const settings = { synchronous_commit: next.synchronousCommit, synchronous_standby_names: next.synchronousStandbyNames }
        if (next.unreplicated && options.singleNode) log.info('commits are not replicated: the embedded PostgreSQL is a single node, for development (set DATABASE_URL for production)', settings)
        else if (next.unreplicated) log.warn(`a failover may lose acknowledged payments: ${next.reason} (docs/how-to/ha-patroni.md)`, settings)
        else if (current) log.info('commits wait for a synchronous standby again', settings)
      }
      current = next
      gauge.set(next.unreplicated ? 1 : 0)
    } catch (error) {
      if (current === undefined) log.warn(`could not read the replication settings: ${errorText(error)}`)
    } finally {
      reading = false
    }
  }
  void check()
  const timer = setInterval(() => void check(), options.intervalMs ?? DURABILITY_CHECK_INTERVAL_MS)
  return {
    get current() { return current },
    stop() {
      clearInterval(timer)
    },
  }
}
