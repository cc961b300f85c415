/**
 * A request that failed after its checks: the answer it gets and the one
 * line the log keeps, by what failed (one table each), and what became of
 * its key.
 */
import type { Lease, StoredResponse } from '../core/types'
import { DeadlineExceededError, ShuttingDownError } from '../core/deadline'
import { IdempotencyError, SQLSTATE, isUnavailable, sqlState } from '../core/errors'
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

/** Why a failed request's key is released, for operators (a deadline may be followed by a late charge). */
export function releaseReasonOf(error: unknown): ReleaseReason {
  if (error instanceof DeadlineExceededError) return 'deadline'
  if (error instanceof ShuttingDownError) return 'shutdown'
  return 'failed'
}

/** The answer: a 5xx problem (or the route's own 5xx answer) that says what a retry will do. */
export function failureResponse(error: unknown, key: KeyState, catalogue: ProblemCatalogue<string>, ttlSeconds: number): Response {
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
  if (key === 'unknown')
    return problemResponse({ ...problem('database-unavailable', `The database did not confirm the completion; ${after}.`), retryAfterSeconds: 1 })
  if (isUnavailable(error) || sqlState(error) === SQLSTATE.QUERY_CANCELED)
    return problemResponse(problem('database-unavailable', `The database is unavailable; ${after}.`))
  // Our own writes waited on a lock for lock_timeout: the request failed (its key was released), nothing is in progress.
  if (sqlState(error) === SQLSTATE.LOCK_NOT_AVAILABLE)
    return problemResponse({ ...problem('database-unavailable', `A database lock was not obtained in time; ${after}.`), retryAfterSeconds: 1 })
  // A problem the route chose, or an error with a catalogued code (e.g. provider-failed, 502); any other is internal.
  if (error instanceof ProblemError)
    return problemResponse({ ...error.problem, detail: `${error.problem.detail ?? error.problem.title}; ${after}.` })
  const code = error instanceof IdempotencyError ? error.code.toLowerCase().replaceAll('_', '-') : ''
  if (error instanceof IdempotencyError && error.status >= 500 && catalogue.has(code))
    return problemResponse(catalogue.problem(code, `${error.message}; ${after}.`))
  return problemResponse(problem('internal', `Processing failed; ${after}.`))
}

/** The line: what failed, and what became of the key (`logger` carries the request's id, tenant, route and key). */
export function reportFailure(logger: Logger, error: unknown, key: KeyState, lease: Lease | undefined): void {
  const fields = {
    outcome: 'failed',
    ...(lease ? { attempt: lease.attempts } : {}),
    key_state: { 'lost-claim': 'claim failed (released under its lease if it committed)', released: 'released', kept: 'not released (reclaimable)', unknown: 'outcome unknown (the completion may have committed)' }[key],
    error,
  }
  if (error instanceof FailedResult) logger.warn(`the handler answered ${error.response.status}`, fields)
  else if (error instanceof DeadlineExceededError) logger.warn(`deadline: processing ran into its deadline (${error.budgetMs} ms) and was stopped; a foreign call in flight may still complete (the provider may have charged)`, { ...fields, outcome: 'deadline' })
  else if (error instanceof ShuttingDownError) logger.warn('stopped by the shutdown before it finished', fields)
  else if (isUnavailable(error) || sqlState(error) === SQLSTATE.QUERY_CANCELED) logger.warn(`database unavailable: ${errorText(error)}`, fields)
  else if (error instanceof IdempotencyError && error.status >= 500) logger.warn(`${error.code.toLowerCase()}: ${error.message}`, fields)
  else logger.error(`processing failed: ${errorText(error)}`, fields)
}
