import { DEFAULT_PURGE_INTERVAL_MS } from '../config'
import { HEARTBEAT_INTERVAL_MS, purgingProcessCount } from '../core/processes'
import { purgeExpiredBatch, PURGE_BATCH_SIZE } from '../core/purge'
import type { Sql } from '../core/types'
import { errorText, type Logger } from '../log'

/**
 * The purges' share of one connection's time, at most, so a backlog never
 * crowds out live traffic: after each full batch a purge pauses four times as
 * long as that batch took. It clears what the database gives it in that share:
 * more on a quiet node, less where the database is busy, its batches slow and
 * its pauses with them. Measured on a quiet node (BENCHMARKS.md, issue 40,
 * 2.5 M keys, 2,700-2,900 payments/s): a fixed 50 ms pause cleared 3.3-3.4x
 * the ingest, a tenth of the connection 3.9x, a fifth 6.9x (5x clears a
 * backlog while serving) with p99 1.16x the rounds without a purge.
 *
 * Every server process runs a purge, and so should every process of an app on
 * the plugin (without one its keys stay forever). SKIP LOCKED keeps their
 * batches apart, and they all delete from the one database, whose ingest does
 * not grow with the number of processes: so the fifth is shared, each purge
 * taking its part by the live processes it counts (heartbeats, counted again
 * every beat). Two instances measured: 1.17x the payments/s of a fifth each,
 * 6.4x the ingest cleared. A process that beats without a purge says so
 * (startHeartbeat's `purges: false`) and is not counted; one that does not
 * say is, and takes a part it leaves unused (measured beside the service:
 * 2.5x the ingest cleared against 4.8x, BENCHMARKS.md).
 */
export const PURGE_SHARE = 0.2
/** Bounds of that pause: a batch of a few rows pauses a little still; one that took seconds does not stop the purge for minutes. */
export const PURGE_PAUSE_BOUNDS_MS = { min: 2, max: 2_000 } as const

/** The pause after a full batch that took `batchMs`, for one of `purgers` purges running at once. */
export function purgePauseMs(batchMs: number, purgers = 1): number {
  const share = PURGE_SHARE / Math.max(1, purgers)
  const pause = batchMs * (1 - share) / share
  return Math.min(PURGE_PAUSE_BOUNDS_MS.max, Math.max(PURGE_PAUSE_BOUNDS_MS.min, pause))
}
/**
 * A run stops after this many batches (250k rows), says what it deleted, and
 * the next goes on from there at once: a backlog waits for no interval (with
 * the 60 s default, waiting held the purge to 250k keys a minute, ~3,400/s
 * at most, whatever its pace).
 */
const BATCHES_PER_RUN = 500

export interface RetentionPurgeOptions {
  readonly sql: Sql
  /** The routes' retentionSeconds: a completed or released key is deleted once past it. */
  readonly retentionSeconds: number
  /** Hears how many keys each batch deleted (the service counts idempotency_purged_keys_total with it). */
  readonly onPurged?: ((deleted: number) => void) | undefined
  /** @default DEFAULT_PURGE_INTERVAL_MS */
  readonly intervalMs?: number | undefined
  readonly batchSize?: number | undefined
  /** A fixed pause after each full batch, instead of one that follows the batch's time (purgePauseMs). */
  readonly pauseMs?: number | undefined
  /** Called with each pause before it is taken, and awaited (tests see the pacing, and act between batches). */
  readonly onPause?: ((pauseMs: number, batchMs: number) => void | Promise<void>) | undefined
  /** The clock a batch is timed by (performance.now). */
  readonly clock?: (() => number) | undefined
  readonly log?: Logger | undefined
  /** Tests move the clock with this. */
  readonly now?: (() => Date | undefined) | undefined
  /** @default BATCHES_PER_RUN */
  readonly batchesPerRun?: number | undefined
  /** When the first run starts. @default at random within the first interval */
  readonly firstRunMs?: number | undefined
}

export interface RetentionPurge {
  /** Runs one purge now (batches until one comes back short, batchesPerRun at most); resolves to the rows deleted. */
  runOnce(): Promise<number>
  /** Stops the timer and waits for a run in progress to finish its current batch. */
  stop(): Promise<void>
}

/**
 * The retention purge: every interval, deletes completed and released keys
 * past `retentionSeconds` in small batches with short pauses (core/purge.ts).
 * Start one in every process that serves idempotent routes, with their
 * retention, and stop it before closing the pools. SKIP LOCKED lets several
 * run at once without waiting on each other, and a random first delay spreads
 * them out.
 */
export function startRetentionPurge(options: RetentionPurgeOptions): RetentionPurge {
  const intervalMs = options.intervalMs ?? DEFAULT_PURGE_INTERVAL_MS
  const batchSize = options.batchSize ?? PURGE_BATCH_SIZE
  const clock = options.clock ?? (() => performance.now())
  const batchesPerRun = options.batchesPerRun ?? BATCHES_PER_RUN
  let stopped = false
  let running: Promise<number> | undefined
  let timer: ReturnType<typeof setTimeout> | undefined
  /** Where a run that stopped at batchesPerRun ended: the next run goes on from there, at once. */
  let backlogFrom: Date | undefined
  let backlog = false
  /** The live processes purging beside this one, this one included, and when they were counted (by `clock`). */
  let purgers = 1
  let countedAt = -Infinity

  async function purgeRun(): Promise<number> {
    let total = 0
    // Each batch starts where the one before ended (core/purge.ts PurgeOptions.from); a run from the oldest, unless it goes on with a backlog.
    let from = backlog ? backlogFrom : undefined
    backlog = false
    for (let batch = 0; !stopped; batch++) {
      if (batch === batchesPerRun) {
        backlog = true
        backlogFrom = from
        break
      }
      if (options.pauseMs === undefined && clock() - countedAt >= HEARTBEAT_INTERVAL_MS) {
        // The purges share the fifth (PURGE_SHARE) among the live processes that purge, counted again as often as they beat,
        // so one that starts or stops during a long run is seen within seconds. A count that fails keeps the last.
        purgers = await purgingProcessCount(options.sql).catch(() => purgers)
        countedAt = clock()
      }
      const started = clock()
      const { deleted, through } = await purgeExpiredBatch(options.sql, { retentionSeconds: options.retentionSeconds, batchSize, now: options.now?.(), from })
      const batchMs = clock() - started
      from = through ?? from
      total += deleted
      if (deleted > 0) options.onPurged?.(deleted)
      if (deleted < batchSize) break
      const pauseMs = options.pauseMs ?? purgePauseMs(batchMs, purgers)
      await options.onPause?.(pauseMs, batchMs)
      await Bun.sleep(pauseMs)
    }
    if (total > 0) options.log?.info(`retention purge: deleted ${total} expired key(s)`, { purged: total })
    return total
  }

  function runOnce(): Promise<number> {
    running ??= purgeRun().finally(() => { running = undefined })
    return running
  }

  function schedule(delayMs: number): void {
    if (stopped) return
    timer = setTimeout(() => {
      runOnce()
        .catch((error: unknown) => options.log?.warn(`retention purge failed (next try in ${intervalMs} ms): ${errorText(error)}`, { error }))
        .finally(() => schedule(backlog ? 0 : intervalMs))
    }, delayMs)
    timer.unref?.()
  }
  schedule(options.firstRunMs ?? Math.floor(Math.random() * intervalMs))

  return {
    runOnce,
    async stop() {
      stopped = true
      clearTimeout(timer)
      await running?.catch(() => undefined)
    },
  }
}
