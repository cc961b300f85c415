/**
 * The completing phase of a request: the route's recording step and the
 * statement (or short transaction) that stores its answer, fenced by the
 * lease, sent again while its connection fails under it.
 */
import { complete } from '../core/complete'
import { completeRows } from '../core/complete-rows'
import { completeRecovering } from '../core/completion-recovery'
import type { Recovery } from '../core/recovery'
import type { Lease, StoredResponse } from '../core/types'
import { FailedResult, routeStep } from './failure'
import { PROBLEM_CONTENT_TYPE } from './problem'
import { problemInstance } from './request-id'
import type { HandlerResult, IdempotencyPools, IdempotentRoute } from './route'

export interface Completion<Body, Result> {
  readonly lease: Lease
  readonly body: Body
  readonly result: Result
  /** The request's id: a stored problem carries it in its `instance`. */
  readonly requestId: string
  /** Recovery until the request's deadline. */
  readonly recovery: Recovery
  /** Called as the completion goes to the database (before that, nothing of it can have committed). */
  readonly sending: () => void
}

export function completer<Body, Result>(route: IdempotentRoute<Body, Result>, pools: IdempotencyPools, now: (() => Date | undefined) | undefined) {
  /** The completion, sent again while the deadline leaves time (core/completion-recovery.ts). */
  return function completeRecoveringRoute(completion: Completion<Body, Result>): Promise<StoredResponse> {
    return completeRecovering(pools.short, completion.lease, (alone) => completeOnce(completion, alone), completion.recovery)
  }

  /** The recording step and the completion, in the route's form. */
  async function completeOnce({ lease, body, result, requestId, sending }: Completion<Body, Result>, alone: boolean): Promise<StoredResponse> {
    const at = now?.()
    const context = { body, tenant: lease.tenant, key: lease.key, result }
    if (route.recordRows) {
      const answer = await routeStep('recordRows', () => route.recordRows!(context))
      const response = toStored(answer, requestId)
      if (answer.status >= 500) throw new FailedResult(response)
      sending()
      return completeRows(pools.short, lease, response, answer.insert, { now: at, alone })
    }
    sending()
    return complete(pools.work, lease, async (tx) => {
      // What the route's code throws is its failure; an error of a statement through `tx` stays the engine's (transaction-guard.ts).
      const answer = await routeStep('record', () => route.record!({ ...context, tx }))
      const response = toStored(answer, requestId)
      if (answer.status >= 500) throw new FailedResult(response)
      return response
    }, { now: at })
  }
}

/**
 * A stored problem carries its first request's `instance`, so its replays
 * are that answer byte for byte (the edge adds `instance` only where none is).
 */
function toStored(result: HandlerResult, requestId: string): StoredResponse {
  const isProblem = result.status >= 400
  const body = isProblem && isPlainObject(result.body) && !('instance' in result.body)
    ? { ...result.body, instance: problemInstance(requestId) }
    : result.body
  return {
    status: result.status,
    headers: { 'content-type': isProblem ? PROBLEM_CONTENT_TYPE : 'application/json', ...result.headers },
    body: JSON.stringify(body),
  }
}

const isPlainObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value)
