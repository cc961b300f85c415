import { completionState } from './completion-state'
import { isLockFailure, isUnavailable, LeaseLostError } from './errors'
import { recovering, type Recovery } from './recovery'
import type { Lease, Sql, StoredResponse } from './types'

/**
 * A completion, sent again while its statement fails for its connection or
 * for a lock another session holds, and the request's deadline is ahead.
 * Before each new attempt the key is read (as the snapshot of our lease sees
 * it): done under our lease is the lost attempt's commit (its stored answer
 * is the answer), processing under our lease means nothing committed (the
 * attempt runs again), anything else a lost lease. A fence that fails on a
 * later attempt is read the same way: the earlier attempt may have committed
 * in between. After a lock failure every attempt goes alone (lane.ts), so no
 * other key waits on that row. One rule for the plugin (http/completion.ts)
 * and the gateway (gateway/exchange.ts).
 *
 * `attempt(alone)` runs one completion: the recording step, if any, and its
 * statement.
 */
export function completeRecovering(sql: Sql, lease: Lease, attempt: (alone: boolean) => Promise<StoredResponse>, recovery: Recovery | undefined): Promise<StoredResponse> {
  let lost = false
  let alone = false
  return recovering('completion', async (number) => {
    if (number > 1) {
      const state = await completionState(sql, lease)
      if (state.kind === 'done') return state.response
      if (state.kind === 'lost') {
        lost = true
        throw new LeaseLostError()
      }
    }
    return attempt(alone)
  }, recovery, (error, number) => {
    if (isLockFailure(error)) alone = true
    return !lost && (isUnavailable(error) || isLockFailure(error) || (error instanceof LeaseLostError && number > 1))
  })
}
