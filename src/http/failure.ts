/**
 * A request that failed after its checks: the answer it gets and the one
 * line the log keeps, by what failed (one table each), and what became of
 * its key.
 */
import type { Lease, StoredResponse } from '../core/types'
import { DeadlineExceededError, ShuttingDownError } from '../core/deadline'
import { DatabaseStatementError, DatabaseUnavailableError, IdempotencyError, SQLSTATE, engineError, isRaisedByEngine } from '../core/errors'
import type { ReleaseReason } from '../core/release'
import { errorText, type Logger } from '../log'
import { problem, ProblemError, problemResponse, type ProblemCatalogue } from './problem'

/**
 * What became of the key of a failed request:
 * - lost-claim: the claim failed; if it committed anyway, it is released under our lease;
 * - released: given back, a retry runs again;
 * - kept: the release failed, so the key becomes reclaimable (at the latest after the TTL);
 * - unknown: the completion's answer was lost: it may have committed.
 */
export type KeyState = 'lost-claim' | 'released' | 'kept' | 'unknown'

/** A recording step answered 5xx: its writes roll back, the key is released, the answer goes out once. */
export class FailedResult extends Error {
  constructor(readonly response: StoredResponse) {
    super(`the handler answered ${response.status}`)
  }
}

/** The parts of a route the plugin runs: an exception of any is the route's failure. */
export type RouteStep = 'act' | 'record' | 'recordRows'

/**
 * An exception of the route's own code (its `act`, its recording step),
 * outside the engine's statements: the route's failure, whatever its code
 * says. An ECONNREFUSED of the route's fetch to its own backend, or a
 * terminated backend of the app's own pool, is not the engine's database
 * being away: it is answered 500 (or with the problem the route chose), not
 * 503 database-unavailable, and it is never run again as a database fault.
 */
export class RouteFailure extends Error {
  constructor(readonly step: RouteStep, cause: unknown) {
    super(`the route's ${step} failed: ${errorText(cause)}`, { cause })
    this.name = 'RouteFailure'
  }
}

/**
 * What an exception of the route's `step` is: the request's own deadline or
 * shutdown (the signal's reason, passed on by the route) and an error of a
 * statement sent through the engine's transaction stay as they are; anything
 * else is the route's failure.
 */
export function routeFailure(step: RouteStep, error: unknown): unknown {
  if (error instanceof DeadlineExceededError || error instanceof ShuttingDownError || error instanceof RouteFailure || isRaisedByEngine(error)) return error
  return new RouteFailure(step, error)
}

/** Runs a step of the route: what it throws or rejects with is its failure (routeFailure). */
export async function routeStep<T>(step: RouteStep, run: () => T | Promise<T>): Promise<T> {
  try {
    return await run()
  } catch (error) {
    throw routeFailure(step, error)
  }
}

/**
 * What the engine's phase of a request failed with, at the seam where the
 * plugin calls the engine: the route's failure (raised by its recording step
 * inside the completion) and the plugin's own as they are, any other as the
 * engine's (engineError: DatabaseUnavailableError, DatabaseStatementError),
 * the driver's error as its cause. Only those answer database-unavailable.
 */
export function fromEngine(error: unknown): unknown {
  if (error instanceof RouteFailure || error instanceof FailedResult || error instanceof DeadlineExceededError || error instanceof ShuttingDownError) return error
  return engineError(error)
}

/** The engine's statement failed for the database: its being away (or a statement cancelled), or a lock not obtained in time. */
function databaseFault(error: unknown): 'unavailable' | 'lock' | undefined {
  if (error instanceof DatabaseUnavailableError) return 'unavailable'
  if (!(error instanceof DatabaseStatementError)) return undefined
  if (error.sqlState === SQLSTATE.QUERY_CANCELED) return 'unavailable'
  if (error.sqlState === SQLSTATE.LOCK_NOT_AVAILABLE) return 'lock'
  return undefined
}

/** The route's own catalogued problem code of `error` (an IdempotencyError's PROVIDER_FAILED is provider-failed), if it has one. */
function routeProblemCode(error: unknown, routeProblems: ProblemCatalogue<string> | undefined): string | undefined {
  // The engine's own types are never a route's chosen answer, even when the route's code raised them (on a handle of its own).
  if (!(error instanceof IdempotencyError) || error instanceof DatabaseUnavailableError || error instanceof DatabaseStatementError || error.status < 500 || !routeProblems) return undefined
  const code = error.code.toLowerCase().replaceAll('_', '-')
  return routeProblems.has(code) ? code : undefined
}

/** Why a failed request's key is released, for operators (a deadline may be followed by a late charge). */
export function releaseReasonOf(error: unknown): ReleaseReason {
  if (error instanceof DeadlineExceededError) return 'deadline'
  if (error instanceof ShuttingDownError) return 'shutdown'
  return 'failed'
}

/**
 * The answer: a 5xx problem (or the route's own 5xx answer) that says what a
 * retry will do. `routeProblems`: the route's own catalogue (its codes only:
 * a route's error is never answered as the engine's database-unavailable).
 */
export function failureResponse(error: unknown, key: KeyState, routeProblems: ProblemCatalogue<string> | undefined, ttlSeconds: number): Response {
  const after = {
    'lost-claim': 'retry with the same Idempotency-Key',
    released: 'the idempotency key was released, so a retry runs again',
    kept: `the idempotency key could not be released now; a retry can take it over within ${ttlSeconds} s`,
    unknown: 'the outcome is unknown; retry with the same Idempotency-Key: a stored answer is replayed, otherwise the request runs again',
  }[key]
  if (error instanceof FailedResult)
    return new Response(error.response.body, { status: error.response.status, headers: error.response.headers })
  if (error instanceof DeadlineExceededError)
    return problemResponse(problem('deadline-exceeded', `Processing ran into its deadline and was stopped; ${after}.`))
  if (error instanceof ShuttingDownError)
    return problemResponse(problem('shutting-down', `This server stopped before the request finished; ${after}.`))
  if (error instanceof RouteFailure) {
    // A problem the route chose, or an error with a code of the route's catalogue (e.g. provider-failed, 502); any other is internal.
    const cause = error.cause
    if (cause instanceof ProblemError)
      return problemResponse({ ...cause.problem, detail: `${cause.problem.detail ?? cause.problem.title}; ${after}.` })
    const code = routeProblemCode(cause, routeProblems)
    if (code) return problemResponse(routeProblems!.problem(code, `${(cause as IdempotencyError).message}; ${after}.`))
    return problemResponse(problem('internal', `Processing failed; ${after}.`))
  }
  if (key === 'unknown')
    return problemResponse({ ...problem('database-unavailable', `The database did not confirm the completion; ${after}.`), retryAfterSeconds: 1 })
  const fault = databaseFault(error)
  if (fault === 'unavailable')
    return problemResponse(problem('database-unavailable', `The database is unavailable; ${after}.`))
  // The engine's own writes (or the recording step's, through its transaction) waited on a lock for lock_timeout: the request failed (its key was released), nothing is in progress.
  if (fault === 'lock')
    return problemResponse({ ...problem('database-unavailable', `A database lock was not obtained in time; ${after}.`), retryAfterSeconds: 1 })
  return problemResponse(problem('internal', `Processing failed; ${after}.`))
}

/**
 * The line: what failed, where (the route's step, or the engine's statement
 * and its driver error), and what became of the key (`logger` carries the
 * request's id, tenant, route and key).
 */
export function reportFailure(logger: Logger, error: unknown, key: KeyState, lease: Lease | undefined, routeProblems?: ProblemCatalogue<string>): void {
  const fields = {
    outcome: 'failed',
    ...(lease ? { attempt: lease.attempts } : {}),
    key_state: { 'lost-claim': 'claim failed (released under its lease if it committed)', released: 'released', kept: 'not released (reclaimable)', unknown: 'outcome unknown (the completion may have committed)' }[key],
    error,
  }
  if (error instanceof FailedResult) logger.warn(`the handler answered ${error.response.status}`, fields)
  else if (error instanceof DeadlineExceededError) logger.warn(`deadline: processing ran into its deadline (${error.budgetMs} ms) and was stopped; a foreign call in flight may still complete (the provider may have charged)`, { ...fields, outcome: 'deadline' })
  else if (error instanceof ShuttingDownError) logger.warn('stopped by the shutdown before it finished', fields)
  else if (error instanceof RouteFailure) {
    const cause = error.cause
    // The route's own catalogued failure (the provider's 502): a warning, as the problem it is answered with says it all.
    if (routeProblemCode(cause, routeProblems)) logger.warn(`${(cause as IdempotencyError).code.toLowerCase()}: ${(cause as IdempotencyError).message}`, { ...fields, error: cause })
    else logger.error(error.message, { ...fields, error: cause, failed_in: error.step })
  } else {
    // The engine's: the line names the driver's error (its SQLSTATE or connection code), not only the engine's wrapper.
    const driver = error instanceof IdempotencyError && error.cause !== undefined ? error.cause : error
    if (databaseFault(error) === 'unavailable' || key === 'unknown') logger.warn(`database unavailable: ${errorText(driver)}`, { ...fields, error: driver })
    else logger.error(`processing failed: ${errorText(driver)}`, { ...fields, error: driver })
  }
}
