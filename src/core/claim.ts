import type postgres from 'postgres'
import type { Claimant, ClaimResult, Lease, RequestIdentity, Sql, StoredResponse } from './types'
import { isExpiredAge, isStaleAge } from './policy'
import { reclaim, renewExpired, retakeReleased } from './reclaim'

interface ClaimRow {
  fresh: boolean
  lease: string
  attempts: number
  request_id: string
  status: 'processing' | 'done' | 'released'
  fingerprint: string
  age_seconds: number
  /** Since completion (done) or release (released): retention counts from there. */
  completed_age_seconds: number | null
  response_status: number | null
  response_headers: Record<string, string> | null
  response_body: string | null
}

/** What the route chose to keep of the request for operators (customer, amount), stored by a fresh claim. */
export interface ClaimSummary {
  readonly summary?: Readonly<Record<string, unknown>> | undefined
}

/**
 * A claim races with others only through the conflicting row; these rounds
 * cover a row that vanishes (purged) or changes hands between our statement
 * and the next. Three rounds were never exhausted in the storm tests.
 */
const MAX_ROUNDS = 4

/**
 * Claims `id.key` for this request, or says why not.
 *
 * One statement does the common cases. The INSERT ... ON CONFLICT DO NOTHING
 * is the lock: of N concurrent claims exactly one inserts, and it commits at
 * once (autocommit), so no later statement of anyone waits on it. Nobody
 * holds a key's row lock across a foreign call (atomic phases: complete.ts
 * locks it for one pipelined round trip), so a retry of an in-flight key is
 * answered at once, from the row as the statement sees it.
 *
 * The INSERT is attempted only when the statement's snapshot sees no row for
 * the key. Without that guard, ON CONFLICT's uniqueness check waits for a
 * transaction that has updated the conflicting row and not yet committed: a
 * completion between its fence and its COMMIT. That is one round trip
 * normally, but a completion frozen half-open holds it until the database
 * ends it (seconds): every retry then waited lock_timeout (1 s) holding a
 * pooled connection, before a 409 (found by test/chaos/half-open.test.ts).
 * The snapshot can miss a row committed just after it was taken (we then
 * conflict but see nothing), or the row can be purged right after: both end
 * in another round.
 *
 * The rare cases take a second, conditional statement (reclaim.ts): a stale
 * processing key (its worker is past its deadline), a released key (its last
 * execution failed), a completed key past its retention.
 */
export async function claim(sql: Sql, id: RequestIdentity & ClaimSummary, claimant: Claimant): Promise<ClaimResult> {
  const now = claimant.now ?? null
  const owner = claimant.owner ?? null
  // The route's summary rides in the INSERT itself: no statement of its own (sql/00006).
  const summary = id.summary === undefined ? null : sql.json(id.summary as postgres.JSONValue)
  for (let round = 0; round < MAX_ROUNDS; round++) {
    const [row] = await sql<ClaimRow[]>`
      with params as (select coalesce(${now}::timestamptz, now()) as now),
      inserted as (
        insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, owner, summary)
        select ${id.tenant}, ${id.key}, ${id.method}, ${id.path}, ${id.fingerprint}, 'processing', now, now, ${owner}::uuid, ${summary}::jsonb from params
         where not exists (select 1 from idempotency_keys where tenant = ${id.tenant} and key = ${id.key})
        on conflict (tenant, key) do nothing
        returning lease, attempts, request_id
      )
      select true as fresh, lease, attempts, request_id, 'processing' as status, ${id.fingerprint} as fingerprint,
             0::float8 as age_seconds, null::float8 as completed_age_seconds,
             null::int as response_status, null::jsonb as response_headers, null::text as response_body
        from inserted
      union all
      select false, k.lease, k.attempts, k.request_id, k.status, k.fingerprint,
             extract(epoch from (p.now - k.locked_at))::float8,
             extract(epoch from (p.now - coalesce(k.completed_at, k.released_at)))::float8,
             k.response_status, k.response_headers, k.response_body
        from idempotency_keys k, params p
       where k.tenant = ${id.tenant} and k.key = ${id.key}
         and not exists (select 1 from inserted)`
    if (!row) continue // conflicted with a row our snapshot cannot see yet, or it vanished
    const seen: Lease = { tenant: id.tenant, key: id.key, lease: row.lease, attempts: row.attempts, requestId: row.request_id }
    if (row.fresh) return { kind: 'created', lease: seen }

    if (row.status === 'done') {
      if (row.completed_age_seconds !== null && isExpiredAge(row.completed_age_seconds, claimant.retentionSeconds)) {
        // Past retention the old answer is forgotten: the request counts as new.
        const renewed = await renewExpired(sql, id, row.lease, claimant)
        if (renewed === 'busy') return inProgress(0, 0)
        if (renewed) return { kind: 'created', lease: renewed }
        continue
      }
      if (row.fingerprint !== id.fingerprint) return { kind: 'mismatch', status: 'done' }
      return { kind: 'replay', response: storedResponse(row) }
    }

    if (row.status === 'released') {
      // Its last execution failed or was stopped; this request runs (again):
      // as the same request (same downstream key) if it is one, within retention.
      const sameRequest = row.fingerprint === id.fingerprint && !isExpiredAge(row.completed_age_seconds ?? 0, claimant.retentionSeconds)
      const retaken = await retakeReleased(sql, id, seen, sameRequest, claimant)
      if (retaken === 'busy') return inProgress(0, 0)
      if (retaken) return { kind: 'created', lease: retaken }
      continue
    }

    if (row.fingerprint !== id.fingerprint) return { kind: 'mismatch', status: 'processing' }
    if (!isStaleAge(row.age_seconds, claimant.ttlSeconds)) return inProgress(claimant.ttlSeconds - row.age_seconds, row.age_seconds)
    const reclaimed = await reclaim(sql, seen, claimant)
    if (reclaimed === 'busy') return inProgress(0, 0) // its completion is committing right now
    if (reclaimed) return { kind: 'reclaimed', lease: reclaimed }
    // Another retry reclaimed it first, or its worker finished: look again.
  }
  return inProgress(0, 0)
}

/**
 * Retry-After: about as long as the first request has already run, between 1
 * second and the TTL left. Most requests finish in milliseconds, so a young
 * key says 1 (sending the TTL left, ~30 s, made honest clients wait 30 s for
 * an answer ready after 5 ms); a long-running one spaces its retries out, and
 * none is told to come back after the key could have been reclaimed.
 */
function inProgress(ttlLeftSeconds: number, ageSeconds: number): ClaimResult {
  const seconds = Math.min(Math.ceil(ageSeconds), Math.ceil(ttlLeftSeconds))
  return { kind: 'in_progress', retryAfterSeconds: Math.max(1, seconds) }
}

function storedResponse(row: ClaimRow): StoredResponse {
  return { status: row.response_status!, headers: row.response_headers ?? {}, body: row.response_body! }
}
