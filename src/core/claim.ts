import { isLockFailure, isUnavailable } from './errors'
import { recovering, type Recovery } from './recovery'
import { newLeaseId } from './lease-id'
import { isExpiredAge } from './policy'
import { reclaim, renewExpired, retakeReleased } from './reclaim'
import type { ClaimMember } from './claim-sql'
import { laneOf } from './lane'
import type { Claimant, ClaimResult, Lease, RequestIdentity, Sql } from './types'

/**
 * A claim races with others only through the conflicting row; these rounds
 * cover a row that vanishes (purged) or changes hands between our statement
 * and the next. Three rounds were never exhausted in the storm tests.
 */
const MAX_ROUNDS = 4

export interface ClaimOptions {
  /** While the claim is still queued for its statement, aborting takes it out (it is never sent); it also ends the recovery's waiting. */
  readonly signal?: AbortSignal | undefined
  /** Run the claim again, with the same lease, when its connection fails under it (recovery.ts). @default one attempt */
  readonly recovery?: Recovery | undefined
}

/**
 * Claims `id.key` for this request, or says why not.
 *
 * One statement does the common cases (claim-sql.ts): an INSERT ... ON
 * CONFLICT DO NOTHING, which is the lock (of N concurrent claims exactly one
 * inserts), committed at once (autocommit), so no later statement of anyone
 * waits on it; or the row as the statement sees it, from which the answer is
 * decided here: replay, in progress (409), mismatch (422). Nobody holds a
 * key's row lock across a foreign call (atomic phases), so a retry of an
 * in-flight key is answered at once.
 *
 * Claims of concurrent requests share statements (lane.ts): one statement
 * carries every claim queued while the previous ones ran, and the
 * completions queued beside them, and each request gets its own row.
 * Requests for the same key within one statement are decided as if they
 * came one after another: the first inserts, the others see its row.
 *
 * The rare cases take a second, conditional statement (reclaim.ts): a stale
 * or abandoned processing key, a released key, a completed key past its
 * retention.
 *
 * A connection that fails under any of these statements leaves it unknown
 * whether it committed; with `options.recovery` the claim is sent again with
 * the same lease, and a key found in processing under that lease is ours: the
 * lost statement committed.
 */
export async function claim(sql: Sql, id: RequestIdentity, claimant: Claimant, options: ClaimOptions = {}): Promise<ClaimResult> {
  // The caller draws the lease (and lists it with its heartbeat) before the
  // claim is sent, so a claim whose answer is lost can still be recognised.
  const lease = claimant.lease ?? newLeaseId()
  const taker = { ...claimant, lease }
  const member: ClaimMember = {
    tenant: id.tenant, key: id.key, method: id.method, path: id.path, fingerprint: id.fingerprint,
    lease, owner: claimant.owner ?? null, now: claimant.now?.toISOString() ?? null, ttl: claimant.ttlSeconds,
    summary: claimant.summary ?? null, http_request_id: claimant.httpRequestId ?? null, request_id: Bun.randomUUIDv7(),
  }
  const recovery = options.recovery && { ...options.recovery, signal: options.signal ?? options.recovery.signal }
  // A claim that gave up on its key's locked row (another session's uncommitted insert of it) committed
  // nothing: it is sent again, alone from then on, so it waits on that row without anyone beside it.
  let alone = false
  return recovering('claim', (attempt) => claimRounds(sql, id, claimant, member, taker, attempt, options.signal, alone), recovery, (error) => {
    if (isLockFailure(error)) alone = true
    return isLockFailure(error) || isUnavailable(error)
  })
}

async function claimRounds(sql: Sql, id: RequestIdentity, claimant: Claimant, member: ClaimMember, taker: Claimant & { lease: string },
  attempt: number, signal: AbortSignal | undefined, alone: boolean): Promise<ClaimResult> {
  for (let round = 0; round < MAX_ROUNDS; round++) {
    const row = await laneOf(sql).claim(member, signal, alone)
    if (!row) continue // conflicted with a row our snapshot cannot see yet, or it vanished
    const seen: Lease = { tenant: id.tenant, key: id.key, lease: row.lease, attempts: row.attempts, requestId: row.request_id }
    if (row.fresh) return { kind: 'created', lease: seen }
    // Our own lease: an earlier attempt of this claim (or of its reclaim) committed, and its answer was lost.
    if (attempt > 1 && row.status === 'processing' && row.lease === taker.lease)
      return { kind: row.attempts > 1 ? 'reclaimed' : 'created', lease: seen }

    if (row.status === 'done') {
      if (row.completed_age_seconds !== null && isExpiredAge(row.completed_age_seconds, claimant.retentionSeconds)) {
        // Past retention the old answer is forgotten: the request counts as new.
        const renewed = await renewExpired(sql, id, row.lease, taker)
        if (renewed === 'busy') return inProgress(0, 0)
        if (renewed) return { kind: 'created', lease: renewed }
        continue
      }
      if (row.fingerprint !== id.fingerprint) return { kind: 'mismatch', status: 'done' }
      return { kind: 'replay', response: { status: row.response_status!, headers: row.response_headers ?? {}, body: row.response_body! }, ageSeconds: row.completed_age_seconds ?? 0 }
    }

    if (row.status === 'released') {
      // Its last execution failed or was stopped. Within the retention the key
      // stays bound to its request, whatever the outcome: another body is a
      // mismatch, never a new request (a new request_id, so a new downstream
      // key, would charge again: the provider may have charged the first).
      // The same request runs again, under the same downstream key.
      const pastRetention = isExpiredAge(row.completed_age_seconds ?? 0, claimant.retentionSeconds)
      if (!pastRetention && row.fingerprint !== id.fingerprint) return { kind: 'mismatch', status: 'released' }
      const retaken = await retakeReleased(sql, id, seen, !pastRetention, taker)
      if (retaken === 'busy') return inProgress(0, 0)
      if (retaken) return { kind: 'created', lease: retaken }
      continue
    }

    if (row.fingerprint !== id.fingerprint) return { kind: 'mismatch', status: 'processing' }
    if (!row.stale && row.worked_on) return inProgress(row.ttl_left_seconds, row.age_seconds)
    // Stale, or nobody works on it (its claim's answer was lost, its owner is gone): take it over.
    const reclaimed = await reclaim(sql, seen, taker)
    if (reclaimed === 'busy') return inProgress(0, 0) // its completion is committing right now
    if (reclaimed) return { kind: 'reclaimed', lease: reclaimed }
    // Another retry reclaimed it first, or its worker finished: look again.
  }
  return inProgress(0, 0)
}

/** Statements that carried this pool's claims so far, and the claims they carried (tests and the bench read it). */
export function claimStats(sql: Sql) {
  return laneOf(sql).claimStats
}

/**
 * Retry-After: about as long as the first request has already run, between 1
 * second and the TTL left. Most requests finish in milliseconds, so a young
 * key says 1 (sending the TTL left, ~30 s, made honest clients wait 30 s for
 * an answer ready after 5 ms); a long-running one spaces its retries out, and
 * none is told to come back after the key could have been reclaimed.
 */
export function inProgress(ttlLeftSeconds: number, ageSeconds: number): ClaimResult & { kind: 'in_progress' } {
  const seconds = Math.min(Math.ceil(ageSeconds), Math.ceil(ttlLeftSeconds))
  return { kind: 'in_progress', retryAfterSeconds: Math.max(1, seconds) }
}
