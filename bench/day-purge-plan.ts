/**
 * The purge's own statement on the seeded table, idle: its plan as it ran
 * (auto_explain, sent back as a notice: no server log to read) and the time
 * of a few batches back to back. The service's purge pauses after each full
 * batch (purgePauseMs: three times the batch's time, alone), so what it clears per second while serving is
 * bounded by batch / (batch time + pause): these figures say which of the two
 * bounds it.
 */
import postgres from 'postgres'
import { purgeExpired, PURGE_BATCH_SIZE } from '../src/core/purge'
import { purgePauseMs } from '../src/maintenance/retention-purge'
import { SESSION_SETTINGS } from '../src/store/db'
import { percentile, round2 } from './load'

/** Batches timed back to back (real deletes of the backlog: 20 × 500 keys). */
const TIMED_BATCHES = 20

export interface PurgePlan {
  readonly batchSize: number
  readonly pauseMs: number
  readonly batchP50Ms: number
  readonly batchMaxMs: number
  /** The most a paced purge clears per second with this batch time: batch / (time + pause). */
  readonly pacedCeiling: number
  /** EXPLAIN (ANALYZE, BUFFERS) of one batch, from auto_explain; undefined if it is not installed. */
  readonly plan: string | undefined
}

export async function purgePlan(url: string, retentionSeconds: number): Promise<PurgePlan> {
  const notices: string[] = []
  // With the engine's session settings (jit off among them): the batch as the service's purge runs it.
  const sql = postgres(url, { max: 1, onnotice: (notice) => notices.push(String(notice.message)), connection: { ...SESSION_SETTINGS } })
  try {
    const times: number[] = []
    for (let i = 0; i < TIMED_BATCHES; i++) {
      const started = performance.now()
      await purgeExpired(sql, { retentionSeconds, batchSize: PURGE_BATCH_SIZE })
      times.push(performance.now() - started)
    }
    let plan: string | undefined
    try {
      await sql`load 'auto_explain'`
      await sql`set auto_explain.log_min_duration = 0`
      await sql`set auto_explain.log_analyze = on`
      await sql`set auto_explain.log_buffers = on`
      await sql`set auto_explain.log_nested_statements = on`
      await sql`set auto_explain.log_level = notice`
      notices.length = 0
      await purgeExpired(sql, { retentionSeconds, batchSize: PURGE_BATCH_SIZE })
      plan = notices.find((text) => /delete on idempotency_keys/i.test(text))
    } catch {
      plan = undefined
    }
    const p50 = percentile(times, 50)
    return {
      batchSize: PURGE_BATCH_SIZE,
      pauseMs: round2(purgePauseMs(p50)),
      batchP50Ms: round2(p50),
      batchMaxMs: round2(Math.max(...times)),
      pacedCeiling: Math.round(PURGE_BATCH_SIZE / ((p50 + purgePauseMs(p50)) / 1000)),
      plan,
    }
  } finally {
    await sql.end()
  }
}
