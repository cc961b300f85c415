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
import { ownerAliveCondition, PROCESS_ALIVE_SECONDS } from './processes'
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
export { ownerAliveCondition, PROCESS_ALIVE_SECONDS }

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

/**
 * Where a rule names the key's tenant inside a subquery: `k.tenant`, or the
 * tenant as a value when the caller gives one (cutoff's `tenant`). On Citus a
 * subquery correlated by the distribution column is not routed to the
 * tenant's shard, and a statement that locks rows is then refused ("could not
 * run distributed query with FOR UPDATE/SHARE commands"); by a value it is.
 */
const TENANT = '\u0002'

const RULES = {
  /**
   * A processing key past its deadline (stale_at: its claim's instant plus
   * the TTL it was claimed with, sql/engine/00005). Its worker has stopped at its
   * own deadline (a margin before), alive or not: a retry reclaims it, an
   * operator may expire it. No setting is needed to judge it: the row knows.
   * Scans start from idempotency_processing (stale_at first).
   */
  stale: (now) => `(k.status = 'processing' and k.stale_at <= ${now})`,
  /**
   * A completed key past its retention: no longer replayed; a claim treats it
   * as a new request (reclaim.ts renewExpired), the purge deletes it. A key
   * completes after its creation, so it is in the range of
   * idempotency_keys_created_at before the cut-off, which the first term
   * gives the planner (an index on completed_at would make every completion
   * a non-HOT update: sql/engine/00005).
   */
  expired: (now, seconds) => `(k.created_at <= ${now} - make_interval(secs => ${seconds}) and k.status = 'done' and k.completed_at <= ${now} - make_interval(secs => ${seconds}))`,
  /**
   * `expired` on a key row of the new form (sql/engine/00020), read where the
   * row is (idempotency_keys `k`, not KEY_STATES): its answer, past the
   * retention. An EXISTS under an OR stays a subplan, a probe of the answer's
   * primary key per row the scan reaches: read through a join instead, the
   * planner's guess of how many rows its status keeps made it hash the whole
   * answer table (the purge's batch at 2 M keys, 1.17 s instead of 4 ms).
   */
  answeredExpired: (now, seconds) => `(k.digest is not null and k.status is null and k.created_at <= ${now} - make_interval(secs => ${seconds})
    and exists (select 1 from idempotency_answers a where a.tenant = ${TENANT} and a.request_id = k.request_id and a.completed_at <= ${now} - make_interval(secs => ${seconds})))`,
  /**
   * A released key past its retention, counted from its release (released_at):
   * counted from the claim, a key stuck longer than the retention would be
   * purged the instant an operator released it, and its retry would get a new
   * downstream key, so a new charge. Like `expired`, a range of created_at.
   */
  releasedExpired: (now, seconds) => `(k.created_at <= ${now} - make_interval(secs => ${seconds}) and k.status = 'released' and k.released_at <= ${now} - make_interval(secs => ${seconds}))`,
  /**
   * Somebody works on processing key `k` (liveness per request, not per
   * process): its owner beats, and either lists the key's lease or claimed
   * it too recently to have listed it (at or after `leases_as_of`: see
   * sql/00005). A live process that does not list a lease it claimed earlier
   * has no request running under it: the claim's answer was lost, or the
   * request ended without a release. Without an owner (a plugin app with no
   * heartbeat) nobody can tell: it is taken for worked on. The process row is
   * `owner_beat`, not `p`: callers name their params row `p`.
   */
  /**
   * The stale rule on an entry of idempotency_processing (aliased `pr`), which
   * carries its key's stale_at: the range its primary key serves.
   */
  staleEntry: (now) => `(pr.stale_at <= ${now})`,
  /**
   * Not a condition: a key's deadline (its stale_at) when claimed at `now`
   * with a TTL of `seconds`, written by every claim and take-over.
   */
  deadline: (now, seconds) => `(${now} + make_interval(secs => ${seconds}))`,
  /**
   * A key that may be past its retention: created before the cut-off (it was
   * completed or released after its creation). A range of
   * idempotency_keys_created_at, for the purge to walk oldest first.
   */
  retentionCandidate: (now, seconds) => `(k.created_at <= ${now} - make_interval(secs => ${seconds}))`,
  workedOn: (now) => `(k.owner is null or exists (
    select 1 from idempotency_processes owner_beat
     where owner_beat.id = k.owner
       and owner_beat.heartbeat_at > ${now} - make_interval(secs => ${PROCESS_ALIVE_SECONDS})
       and (k.lease = any(owner_beat.leases) or owner_beat.leases_as_of is null or k.locked_at >= owner_beat.leases_as_of)))`,
} as const satisfies Record<string, Rule>

export type CutoffName = keyof typeof RULES

/** The rule as a fragment, its instant and seconds (and the tenant, where given) bound as parameters. */
export function cutoff(sql: Sql, name: CutoffName, now: Instant, seconds: number, tenant?: string): Fragment {
  const text = RULES[name]('\u0000', '\u0001').replaceAll(TENANT, tenant === undefined ? 'k.tenant' : TENANT)
  const strings: string[] = []
  const values: unknown[] = []
  let start = 0
  for (let i = 0; i < text.length; i++) {
    const hole = text[i]
    if (hole !== '\u0000' && hole !== '\u0001' && hole !== TENANT) continue
    strings.push(text.slice(start, i))
    values.push(hole === '\u0000' ? instant(sql, now) : hole === TENANT ? tenant : seconds)
    start = i + 1
  }
  strings.push(text.slice(start))
  // A tagged-template call made by hand: postgres.js binds `values` as $n parameters.
  const template = Object.assign(strings, { raw: strings }) as unknown as TemplateStringsArray
  return (sql as postgres.Sql)(template, ...(values as postgres.ParameterOrFragment<never>[])) as Fragment
}

/** The rule as SQL text, for statements kept as text (the gauges, whose plans a test asserts). */
export function cutoffText(name: CutoffName, now: string, seconds: string): string {
  return RULES[name](now, seconds).replaceAll(TENANT, 'k.tenant')
}

/** Stale: processing and past its deadline (the row's stale_at). */
export const stale = (sql: Sql, now: Instant): Fragment => cutoff(sql, 'stale', now, 0)
/** Expired: done and past the retention. */
export const expired = (sql: Sql, now: Instant, retentionSeconds: number): Fragment => cutoff(sql, 'expired', now, retentionSeconds)
/** Done and past the retention, a key row of the new form (its answer apart). */
export const answeredExpired = (sql: Sql, now: Instant, retentionSeconds: number, tenant?: string): Fragment => cutoff(sql, 'answeredExpired', now, retentionSeconds, tenant)
/** Released and past the retention. */
export const releasedExpired = (sql: Sql, now: Instant, retentionSeconds: number): Fragment => cutoff(sql, 'releasedExpired', now, retentionSeconds)

/**
 * A processing key nobody can be finishing: stale (its worker has stopped at
 * its deadline, alive or not), or, before that, worked on by no live request
 * (workedOn above: its owner is gone, or its owner does not
 * list the lease: the claim's answer was lost). A retry takes it over
 * (reclaim.ts), an operator may force-expire it. Before the deadline of a
 * request that runs, never: that worker will finish or fail on its own.
 */
/** A processing-list entry past its deadline (the `stale` rule, on the entry). */
export const staleEntry = (sql: Sql, now: Instant): Fragment => cutoff(sql, 'staleEntry', now, 0)
/** The stale_at of a key claimed at `now` (a fragment, e.g. p.now) with `ttlSeconds`. */
export const deadlineAt = (sql: Sql, now: Instant, ttlSeconds: number): Fragment => cutoff(sql, 'deadline', now, ttlSeconds)
/** May be past its retention: for the purge's range. */
export const retentionCandidate = (sql: Sql, now: Instant, retentionSeconds: number): Fragment => cutoff(sql, 'retentionCandidate', now, retentionSeconds)

/** Somebody works on the processing key (the rule above). */
export const workedOnCondition = (sql: Sql, now: Instant): Fragment => cutoff(sql, 'workedOn', now, 0)

export function abandoned(sql: Sql, now: Instant): Fragment {
  return sql`(${stale(sql, now)} or (k.status = 'processing' and not ${workedOnCondition(sql, now)}))` as Fragment
}

/**
 * The summary field that marks a key held (hold.ts): processing with no owner,
 * so every retry is answered 409 until the TTL, and no worker runs it.
 */
export const HELD_MARK = 'held'

/**
 * When an operator may force-expire a processing key: once it is abandoned,
 * or when it is held (hold.ts): no worker runs it, it waits for a decision,
 * and an operator's is the one it waits for.
 */
export function forceExpirable(sql: Sql, now: Instant): Fragment {
  return sql`(${abandoned(sql, now)} or (k.status = 'processing' and k.owner is null and coalesce(k.summary ? ${HELD_MARK}, false)))` as Fragment
}

/**
 * The instant as SQL: a fragment as is, else the given time or the database's
 * now(). Two texts, not `coalesce($1, now())`: Citus refuses a stable
 * function inside a COALESCE in an UPDATE of a distributed table (the
 * take-overs' SET, reclaim.ts), and evaluates a bare now() once, on the
 * coordinator, before it routes the statement.
 */
export function instant(sql: Sql, now: Instant): Fragment {
  if (now instanceof Date) return sql`${now}::timestamptz`
  if (now === null || now === undefined) return sql`now()`
  return now
}

/**
 * The expired cut-off on an age the database already computed (claim.ts
 * reads the row once, then decides in TypeScript): the same boundary as the
 * SQL above, `<=` there being `>=` on the age here.
 */
export const isExpiredAge = (ageSeconds: number, retentionSeconds: number): boolean => ageSeconds >= retentionSeconds

/** When a key completed or released at `at` leaves its retention: past it, it is expired (and purged). */
export function retentionEndOf(at: Date, retentionSeconds: number): Date {
  return new Date(at.getTime() + retentionSeconds * 1000)
}

/** retentionEndOf in SQL, over key row `k` (done or released), given the allowed seconds as an SQL expression. */
export function retentionEndText(seconds: string): string {
  return `(coalesce(k.completed_at, k.released_at) + make_interval(secs => ${seconds}))`
}
