import { DEFAULT_PURGE_INTERVAL_MS } from '../config'
import { HEARTBEAT_INTERVAL_MS, keptRetentionSeconds, purgeTurn, purgingProcessCount, type PurgeTurn } from '../core/processes'
import { purgeExpiredBatch, PURGE_BATCH_SIZE } from '../core/purge'
import type { Sql } from '../core/types'
import { errorText, type Logger } from '../log'

/**
 * The purges' share of one connection's time, at most, so a backlog never
 * crowds out live traffic: after each full batch a purge pauses three times as
 * long as that batch took. It clears what the database gives it in that share:
 * more on a quiet node, less where the database is busy, its batches slow and
 * its pauses with them. Measured on a quiet node (BENCHMARKS.md, issue 40,
 * 2.5 M keys, 2,700-2,900 payments/s): a fixed 50 ms pause cleared 3.3-3.4x
 * the ingest, a tenth of the connection 3.9x, a fifth 6.9x (5x clears a
 * backlog while serving) with p99 1.16x the rounds without a purge. At 10 M
 * keys a batch costs more: a fifth cleared 4.1x (p99 1.18x), a quarter 5.0x
 * (rounds 4.6-5.1x, p99 0.93x; at 2 M keys 5.0x and 1.06x, where batches of
 * 1,000 at a quarter cleared 6.2x with p99 1.27x).
 *
 * Every server process runs a purge, and so should every process of an app on
 * the plugin (without one its keys stay forever). They all delete from the one
 * database, whose ingest does not grow with the number of processes, so the
 * quarter is the database's, not each process's:
 * - A purge told its process's heartbeat (`processId`, the heartbeat saying
 *   `purges: true`) takes turns: the oldest such live process purges at the
 *   whole quarter, the others stand by (core/processes.ts purgeTurn). Two purges
 *   sharing by count cleared 0.7x what one clears on one machine, 0.92x on
 *   another, where taking turns cleared 0.94x (BENCHMARKS.md).
 * - One not told shares the quarter by the live processes it counts
 *   (heartbeats, counted again every beat), as does a leader with such
 *   processes beside it. A process that beats without a purge says so
 *   (`purges: false`) and is not counted; one that does not say is, and takes
 *   a part it may leave unused (2.5x the ingest cleared against 4.8x).
 * SKIP LOCKED keeps batches apart wherever two run at once.
 */
export const PURGE_SHARE = 0.25
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
  /**
   * The routes' retentionSeconds (the longest of them): a completed or
   * released key is deleted once past it, or past the longest retention a
   * process's heartbeat says, if longer (core/processes.ts keptRetentionSeconds).
   */
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
  /**
   * This process's heartbeat id (startHeartbeat, told `purges: true`): the
   * purges then take turns, this one running only while its process is the
   * oldest live one that purges, at the whole share. Without it the purge
   * shares the fifth by count with every process that may purge.
   */
  readonly processId?: string | undefined
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
 * retention, and stop it before closing the pools. Told its heartbeat
 * (`processId`), it runs only on its process's turn (PURGE_SHARE above);
 * where several run at once SKIP LOCKED keeps them from waiting on each
 * other, and a random first delay spreads them out.
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
  /** Whether this purge runs, the live processes purging beside it (it included), and when they were counted (by `clock`). */
  let turn: PurgeTurn = { leads: true, purgers: 1, longestRetention: null }
  /** The retention the last batch deleted by, so that a change is said once. */
  let keptBy = options.retentionSeconds
  let countedAt = -Infinity
  const { processId } = options
  const recount = (): Promise<PurgeTurn> => processId === undefined
    ? purgingProcessCount(options.sql).then(({ purgers, longestRetention }) => ({ leads: true, purgers, longestRetention }))
    : purgeTurn(options.sql, processId)

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
      if ((options.pauseMs === undefined || processId !== undefined) && clock() - countedAt >= HEARTBEAT_INTERVAL_MS) {
        // Counted again as often as the processes beat, so one that starts or stops during a long run is seen
        // within seconds. A count that fails keeps the last.
        const leading = turn.leads
        turn = await recount().catch(() => turn)
        countedAt = clock()
        if (leading !== turn.leads) options.log?.info(turn.leads ? 'retention purge: this process purges now' : 'retention purge: another process purges; this one stands by', { purge_leads: turn.leads })
      }
      if (!turn.leads) break
      const retentionSeconds = keptRetentionSeconds(options.retentionSeconds, turn.longestRetention)
      if (retentionSeconds !== keptBy) {
        options.log?.info(retentionSeconds === options.retentionSeconds
          ? `retention purge: deletes keys past this process's retention (${retentionSeconds} s) again`
          : `retention purge: a process keeps keys for ${retentionSeconds} s (live, or gone less than that ago), longer than this process's ${options.retentionSeconds} s; deleting past the longer`,
        { retention_seconds: retentionSeconds })
        keptBy = retentionSeconds
      }
      const started = clock()
      const { deleted, through } = await purgeExpiredBatch(options.sql, { retentionSeconds, batchSize, now: options.now?.(), from })
      const batchMs = clock() - started
      from = through ?? from
      total += deleted
      if (deleted > 0) options.onPurged?.(deleted)
      if (deleted < batchSize) break
      const pauseMs = options.pauseMs ?? purgePauseMs(batchMs, turn.purgers)
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
