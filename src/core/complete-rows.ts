import type postgres from 'postgres'
import { COMPLETION_TIMEOUT_MS, type CompleteOptions } from './complete'
import type { CompletionMember, RowWrites } from './completion-sql'
import { DatabaseUnavailableError, isUnavailable, LeaseLostError } from './errors'
import { laneOf } from './lane'
import type { Lease, StoredResponse } from './types'

export type { RowWrites } from './completion-sql'

/** Table and column names: route code chooses them, but they are spliced into SQL, so they are checked. */
const IDENTIFIER = /^[a-z_][a-z0-9_]{0,62}$/

/**
 * The completing phase in one autocommit statement: the fence (the key's
 * lease must still be current), the state change, the stored answer, the
 * key leaving the processing list, and the route's rows, together. A stored
 * answer exists only if its rows committed (invariant 2), and they commit
 * only if the lease held (invariant 4): one statement is one transaction.
 *
 * Against the transactional form (complete.ts: BEGIN, writes, fence, COMMIT)
 * it saves three statements and two round trips per request, and it batches:
 * completions queued while others run share one statement, with the claims
 * queued beside them (lane.ts), one WAL flush for all (group commit). A
 * member whose lease was lost is a row missing from the answer, and its rows
 * are not written (their INSERT reads the fenced set); the others commit. A batch that fails on its data (a CHECK
 * of one member's row) is run again member by member, so only that one fails.
 *
 * Locks: the UPDATE holds the key rows for the statement only; a reclaim
 * racing it either commits first (the UPDATE then re-checks the lease and
 * skips the row: fenced) or finds the row locked (NOWAIT: 409) and then done.
 */
export interface CompleteRowsOptions extends CompleteOptions {
  /** In a statement of its own, sent at once: a completion whose key's row was found locked waits there alone (lane.ts). @default false */
  readonly alone?: boolean
}

export async function completeRows(pool: postgres.Sql<Record<string, never>>, lease: Lease, response: StoredResponse, writes: RowWrites, options: CompleteRowsOptions = {}): Promise<StoredResponse> {
  for (const [table, rows] of Object.entries(writes)) {
    if (!IDENTIFIER.test(table)) throw new TypeError(`not a table name: ${JSON.stringify(table)}`)
    for (const row of rows) for (const column of Object.keys(row)) if (!IDENTIFIER.test(column)) throw new TypeError(`not a column name: ${JSON.stringify(column)}`)
  }
  const member: CompletionMember = { tenant: lease.tenant, key: lease.key, lease: lease.lease, response, at: options.now?.toISOString() ?? null, writes }
  let timer: ReturnType<typeof setTimeout> | undefined
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DatabaseUnavailableError(new Error('the completing statement got no answer in time'))), options.timeoutMs ?? COMPLETION_TIMEOUT_MS)
  })
  try {
    const fenced = await Promise.race([laneOf(pool).complete(member, options.alone), timedOut])
    if (!fenced) throw new LeaseLostError()
    return response
  } catch (error) {
    if (error instanceof LeaseLostError || error instanceof DatabaseUnavailableError) throw error
    throw isUnavailable(error) ? new DatabaseUnavailableError(error) : error
  } finally {
    clearTimeout(timer)
  }
}

/** Statements that carried this pool's completions so far, and the completions they carried. */
export function completionStats(pool: postgres.Sql<Record<string, never>>) {
  return laneOf(pool).completionStats
}
