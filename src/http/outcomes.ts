import type { ReleaseReason } from '../core/release'
import type { RetryCause, StatementKind } from '../core/recovery'
import { log } from '../log'

/**
 * What the plugin reports, for the app to count (prom-client, logs, ...): the
 * plugin itself knows no metrics library, so any app can wire it its own way.
 */

/** Every outcome an idempotent request can have; the dashboards rely on these names. */
export const OUTCOMES = ['created', 'replayed', 'in_progress', 'mismatch', 'invalid', 'reclaimed', 'failed', 'lease_lost'] as const
export type Outcome = (typeof OUTCOMES)[number]

export interface OutcomeEvent {
  /** The route's path template, as given to idempotentPost. */
  readonly route: string
  readonly outcome: Outcome
  /** Time spent on the request, from its arrival to its answer. */
  readonly seconds: number
}

export interface RouteEvent {
  readonly route: string
}

export { RELEASE_REASONS, type ReleaseReason } from '../core/release'

export interface ReleaseEvent extends RouteEvent {
  readonly reason: ReleaseReason
}

export { RETRY_CAUSES, STATEMENT_KINDS, type RetryCause, type StatementKind } from '../core/recovery'

export interface RetryEvent extends RouteEvent {
  readonly statement: StatementKind
  readonly cause: RetryCause
}

/**
 * Called synchronously on the request's path, so keep them cheap (a counter
 * increment). One that throws is logged and ignored: counting never changes
 * an answer.
 */
export interface IdempotencyHooks {
  /** Once per request that reached the plugin with valid credentials. */
  readonly onOutcome?: (event: OutcomeEvent) => void
  /** A stale or released key was taken over by this request (its outcome is then `reclaimed`). */
  readonly onReclaim?: (event: RouteEvent) => void
  /** This request's claim was taken over before it could commit; its writes rolled back. */
  readonly onLeaseLost?: (event: RouteEvent) => void
  /** A failed request gave its key back, so a retry runs again. */
  readonly onRelease?: (event: ReleaseEvent) => void
  /** This request ran into its deadline (its key is then released with reason `deadline`, if the database takes it). */
  readonly onDeadline?: (event: RouteEvent) => void
  /** A statement of this request was sent again after its connection failed under it (core/recovery.ts). */
  readonly onRetry?: (event: RetryEvent) => void
}

/** Calls `hook`, never letting it throw into the request. */
export function notify<E>(name: string, hook: ((event: E) => void) | undefined, event: E): void {
  if (!hook) return
  try {
    hook(event)
  } catch (error) {
    log.error(`idempotency hook ${name} threw`, { error })
  }
}
