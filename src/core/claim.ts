import type { ClaimResult, Lease, RequestIdentity, Sql, StoredResponse, Timing } from './types'
import { reclaim, renewExpired } from './reclaim'

interface ClaimRow {
  fresh: boolean
  lease: string
  attempts: number
  status: 'processing' | 'done'
  fingerprint: string
  age_seconds: number
  completed_age_seconds: number | null
  response_status: number | null
  response_headers: Record<string, string> | null
  response_body: string | null
}

/**
 * A claim races with others only through the conflicting row; these rounds
 * cover a row that vanishes (released, purged) or changes hands between our
 * statement and the next. Three rounds were never exhausted in the storm tests.
 */
const MAX_ROUNDS = 4

/**
 * Claims `id.key` for this request, or says why not.
 *
 * One statement does the common cases. The INSERT ... ON CONFLICT DO NOTHING
 * is the lock: of N concurrent claims exactly one inserts. It does not wait on
 * a row that a worker holds with SELECT ... FOR UPDATE (see lease.ts), so a
 * retry of an in-flight key is answered at once. When nothing was inserted,
 * the second branch returns the existing row from the statement's snapshot.
 * That snapshot can miss a row committed just after it was taken (we then
 * conflict but see nothing), or the row can be deleted right after: both end
 * in another round.
 */
export async function claim(sql: Sql, id: RequestIdentity, timing: Timing): Promise<ClaimResult> {
  const now = timing.now ?? null
  for (let round = 0; round < MAX_ROUNDS; round++) {
    const [row] = await sql<ClaimRow[]>`
      with params as (select coalesce(${now}::timestamptz, now()) as now),
      inserted as (
        insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at)
        select ${id.tenant}, ${id.key}, ${id.method}, ${id.path}, ${id.fingerprint}, 'processing', now, now from params
        on conflict (tenant, key) do nothing
        returning lease, attempts
      )
      select true as fresh, lease, attempts, 'processing' as status, ${id.fingerprint} as fingerprint,
             0::float8 as age_seconds, null::float8 as completed_age_seconds,
             null::int as response_status, null::jsonb as response_headers, null::text as response_body
        from inserted
      union all
      select false, k.lease, k.attempts, k.status, k.fingerprint,
             extract(epoch from (p.now - k.locked_at))::float8,
             extract(epoch from (p.now - k.completed_at))::float8,
             k.response_status, k.response_headers, k.response_body
        from idempotency_keys k, params p
       where k.tenant = ${id.tenant} and k.key = ${id.key}
         and not exists (select 1 from inserted)`
    if (!row) continue // conflicted with a row our snapshot cannot see yet, or it vanished
    const lease: Lease = { tenant: id.tenant, key: id.key, lease: row.lease, attempts: row.attempts }
    if (row.fresh) return { kind: 'created', lease }

    if (row.status === 'done' && row.completed_age_seconds !== null && row.completed_age_seconds >= timing.retentionSeconds) {
      // Past retention the old answer is forgotten: the request counts as new.
      const renewed = await renewExpired(sql, id, row.lease, timing)
      if (renewed === 'busy') return inProgress(0, 0)
      if (renewed) return { kind: 'created', lease: renewed }
      continue
    }
    if (row.fingerprint !== id.fingerprint) return { kind: 'mismatch', status: row.status }
    if (row.status === 'done') return { kind: 'replay', response: storedResponse(row) }

    const ttlLeft = timing.ttlSeconds - row.age_seconds
    if (ttlLeft > 0) return inProgress(ttlLeft, row.age_seconds)
    const reclaimed = await reclaim(sql, lease, timing)
    if (reclaimed === 'busy') return inProgress(0, 0) // its worker is alive and holds the row
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
