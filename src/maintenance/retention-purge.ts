import { DEFAULT_PURGE_INTERVAL_MS } from '../config'
import { purgeExpiredBatch, PURGE_BATCH_SIZE } from '../core/purge'
import type { Sql } from '../core/types'
import type { Metrics } from '../metrics/registry'
import { errorText, type Logger } from '../log'

/**
 * Pause between two full batches of one run: the purge takes at most
 * ~5 ms / (5 + 50 ms) ≈ 10% of one connection, so a backlog never crowds out
 * live traffic.
 */
export const PURGE_PAUSE_MS = 50
/** A run stops after this many batches (250k rows) and resumes at the next interval. */
const MAX_BATCHES_PER_RUN = 500

export interface RetentionPurgeOptions {
  readonly sql: Sql
  readonly retentionSeconds: number
  readonly metrics?: Metrics | undefined
  /** @default DEFAULT_PURGE_INTERVAL_MS */
  readonly intervalMs?: number | undefined
  readonly batchSize?: number | undefined
  readonly pauseMs?: number | undefined
  readonly log?: Logger | undefined
  /** Tests move the clock with this. */
  readonly now?: (() => Date | undefined) | undefined
}

export interface RetentionPurge {
  /** Runs one purge now (batches until one comes back short); resolves to the rows deleted. */
  runOnce(): Promise<number>
  /** Stops the timer and waits for a run in progress to finish its current batch. */
  stop(): Promise<void>
}

/**
 * The retention purge: every interval, deletes completed keys past retention
 * in small batches with short pauses (core/purge.ts). Runs in every server
 * process; SKIP LOCKED lets several run at once without waiting on each other,
 * and a random first delay spreads them out.
 */
export function startRetentionPurge(options: RetentionPurgeOptions): RetentionPurge {
  const intervalMs = options.intervalMs ?? DEFAULT_PURGE_INTERVAL_MS
  const batchSize = options.batchSize ?? PURGE_BATCH_SIZE
  const pauseMs = options.pauseMs ?? PURGE_PAUSE_MS
  let stopped = false
  let running: Promise<number> | undefined
  let timer: ReturnType<typeof setTimeout> | undefined

  async function purgeRun(): Promise<number> {
    let total = 0
    // Each batch starts where the one before ended (core/purge.ts PurgeOptions.from); each run from the oldest.
    let from: Date | undefined
    for (let batch = 0; batch < MAX_BATCHES_PER_RUN && !stopped; batch++) {
      const { deleted, through } = await purgeExpiredBatch(options.sql, { retentionSeconds: options.retentionSeconds, batchSize, now: options.now?.(), from })
      from = through ?? from
      total += deleted
      if (deleted > 0) options.metrics?.purgedKeys.inc(deleted)
      if (deleted < batchSize) break
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
        .finally(() => schedule(intervalMs))
    }, delayMs)
    timer.unref?.()
  }
  schedule(Math.floor(Math.random() * intervalMs))

  return {
    runOnce,
    async stop() {
      stopped = true
      clearTimeout(timer)
      await running?.catch(() => undefined)
    },
  }
}
