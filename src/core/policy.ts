/**
 * The key lifecycle policy: one home for every rule about time.
 *
 * - the defaults of the TTL and the retention (config.ts validates the
 *   environment against them, the server records what it runs with in
 *   idempotency_settings, and operator commands apply that record);
 * - the deadline of one execution, a margin before the TTL ends;
 * - the cut-offs, as SQL over a key row aliased `k`:
 *   stale (processing past its TTL), expired (done past its retention),
 *   released-expired (released past its retention), and force-expirable.
 *
 * Every query that judges a key by time takes its cut-off from here: the
 * engine's take-overs (reclaim.ts), the operator reads and actions
 * (src/operations, core/force-expire.ts, core/expire-stale.ts,
 * core/purge.ts), the gauges (metrics/read-processing-gauges.ts) and so the
 * admin page, the JSON API, the CLI and the alerts. Change a rule here and
 * all of them follow.
 *
 * Each cut-off is written once, as SQL text with two holes (the instant it is
 * judged at, the seconds it allows); `cutoff()` binds them as parameters of a
 * postgres.js fragment, `cutoffText()` fills them with SQL of the caller's
 * (`$1`) for the prepared gauge statements.
 */
import type postgres from 'postgres'
import { ownerAliveCondition, PROCESS_ALIVE_SECONDS, workedOnCondition } from './processes'
import type { Sql } from './types'

/** 30 s: long enough for a payment provider's slowest honest answer, short enough that a dead worker's key frees up before a client gives up. */
export const DEFAULT_TTL_SECONDS = 30
/** One day: clients retry within minutes; a day covers overnight batch re-runs. */
export const DEFAULT_RETENTION_SECONDS = 86_400
/** The least TTL the service accepts: the deadline margin below needs a second to be a margin at all. */
export const MIN_TTL_SECONDS = 1

/**
 * The deadline of one execution of a request: a little before its key's TTL
 * ends, so that the completing transaction still fits before the key may be
 * reclaimed. The margin is a tenth of the TTL, between 200 ms and 2 s: with
 * the default 30 s TTL the handler is stopped at 28 s; with a 1 s TTL (the
 * least allowed) at 800 ms.
 */
export const MIN_DEADLINE_MARGIN_MS = 200
export const MAX_DEADLINE_MARGIN_MS = 2_000

export function deadlineMarginMs(ttlSeconds: number): number {
  return Math.min(MAX_DEADLINE_MARGIN_MS, Math.max(MIN_DEADLINE_MARGIN_MS, ttlSeconds * 100))
}

/** Milliseconds a freshly claimed request may run, counted from its claim. */
export function executionBudgetMs(ttlSeconds: number): number {
  return Math.max(0, ttlSeconds * 1000 - deadlineMarginMs(ttlSeconds))
}

/** Liveness of a key's owner (heartbeat rows, processes.ts), re-exported so the whole policy reads from here. */
export { ownerAliveCondition, PROCESS_ALIVE_SECONDS, workedOnCondition }

/** A postgres.js fragment, nested into a query with `${...}`. */
export type Fragment = postgres.PendingQuery<postgres.Row[]>

/**
 * The instant a cut-off is judged at: a Date (tests move the clock; an
 * operator's "as of"), undefined or null for the database's now(), or a SQL
 * fragment yielding a timestamptz (a query's `p.now`).
 */
export type Instant = Date | null | undefined | Fragment

/** A rule: SQL text over key row `k`, given the instant and the allowed seconds as SQL expressions. */
type Rule = (now: string, seconds: string) => string

const RULES = {
  /**
   * A processing key whose current lease is older than the TTL. Its worker
   * has stopped at its deadline (a margin before), alive or not: a retry
   * reclaims it, an operator may expire it. Served by the partial index
   * idempotency_keys_processing (locked_at first).
   */
  stale: (now, seconds) => `(k.status = 'processing' and k.locked_at <= ${now} - make_interval(secs => ${seconds}))`,
  /**
   * A completed key past its retention: no longer replayed; a claim treats it
   * as a new request (reclaim.ts renewExpired), the purge deletes it. A range
   * of idempotency_keys_done_completed_at.
   */
  expired: (now, seconds) => `(k.status = 'done' and k.completed_at <= ${now} - make_interval(secs => ${seconds}))`,
  /**
   * A released key past its retention, counted from its release (released_at):
   * counted from the claim, a key stuck longer than the retention would be
   * purged the instant an operator released it, and its retry would get a new
   * downstream key, so a new charge. A range of idempotency_keys_released_at.
   */
  releasedExpired: (now, seconds) => `(k.status = 'released' and k.released_at <= ${now} - make_interval(secs => ${seconds}))`,
} as const satisfies Record<string, Rule>

export type CutoffName = keyof typeof RULES

/** The rule as a fragment, its instant and seconds bound as parameters. */
export function cutoff(sql: Sql, name: CutoffName, now: Instant, seconds: number): Fragment {
  const text = RULES[name]('\u0000', '\u0001')
  const strings: string[] = []
  const values: unknown[] = []
  let start = 0
  for (let i = 0; i < text.length; i++) {
    const hole = text[i]
    if (hole !== '\u0000' && hole !== '\u0001') continue
    strings.push(text.slice(start, i))
    values.push(hole === '\u0000' ? instant(sql, now) : seconds)
    start = i + 1
  }
  strings.push(text.slice(start))
  // A tagged-template call made by hand: postgres.js binds `values` as $n parameters.
  const template = Object.assign(strings, { raw: strings }) as unknown as TemplateStringsArray
  return (sql as postgres.Sql)(template, ...(values as postgres.ParameterOrFragment<never>[])) as Fragment
}

/** The rule as SQL text, for statements kept as text (the gauges, whose plans a test asserts). */
export function cutoffText(name: CutoffName, now: string, seconds: string): string {
  return RULES[name](now, seconds)
}

/** Stale: processing and past the TTL. */
export const stale = (sql: Sql, now: Instant, ttlSeconds: number): Fragment => cutoff(sql, 'stale', now, ttlSeconds)
/** Expired: done and past the retention. */
export const expired = (sql: Sql, now: Instant, retentionSeconds: number): Fragment => cutoff(sql, 'expired', now, retentionSeconds)
/** Released and past the retention. */
export const releasedExpired = (sql: Sql, now: Instant, retentionSeconds: number): Fragment => cutoff(sql, 'releasedExpired', now, retentionSeconds)

/**
 * A processing key nobody can be finishing: stale (its worker has stopped at
 * its deadline, alive or not), or, before that, worked on by no live request
 * (processes.ts workedOnCondition: its owner is gone, or its owner does not
 * list the lease: the claim's answer was lost). A retry takes it over
 * (reclaim.ts), an operator may force-expire it. Before the deadline of a
 * request that runs, never: that worker will finish or fail on its own.
 */
export function abandoned(sql: Sql, now: Instant, ttlSeconds: number): Fragment {
  return sql`(${stale(sql, now, ttlSeconds)} or (k.status = 'processing' and not ${workedOnCondition(sql, now)}))` as Fragment
}

/** When an operator may force-expire a processing key: once it is abandoned. */
export function forceExpirable(sql: Sql, now: Instant, ttlSeconds: number): Fragment {
  return abandoned(sql, now, ttlSeconds)
}

/** The instant as SQL: a fragment as is, else the given time or the database's now(). */
export function instant(sql: Sql, now: Instant): Fragment {
  if (now === null || now === undefined || now instanceof Date) return sql`coalesce(${now ?? null}::timestamptz, now())`
  return now
}

/**
 * The stale and expired cut-offs on an age the database already computed
 * (claim.ts reads the row once, then decides in TypeScript): the same
 * boundaries as the SQL above, `<=` there being `>=` on the age here.
 */
export const isStaleAge = (ageSeconds: number, ttlSeconds: number): boolean => ageSeconds >= ttlSeconds
export const isExpiredAge = (ageSeconds: number, retentionSeconds: number): boolean => ageSeconds >= retentionSeconds

/** When the current lease of a key locked at `lockedAt` reaches its TTL: past it, the key is stale. */
export function deadlineOf(lockedAt: Date, ttlSeconds: number): Date {
  return new Date(lockedAt.getTime() + ttlSeconds * 1000)
}

/** When a key completed or released at `at` leaves its retention: past it, it is expired (and purged). */
export function retentionEndOf(at: Date, retentionSeconds: number): Date {
  return new Date(at.getTime() + retentionSeconds * 1000)
}
