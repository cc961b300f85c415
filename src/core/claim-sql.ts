import { membersCondition } from './batch-input'
import { CLAIMS_APART, KEY_STATES } from './key-states'
import { cutoffText } from './policy'

/** One claim of a batch, as the statement reads it (JSON: jsonb_to_recordset). */
export interface ClaimMember {
  readonly tenant: string
  readonly key: string
  readonly method: string
  readonly path: string
  readonly fingerprint: string
  /** Drawn by the service (lease-id.ts). */
  readonly lease: string
  /** The claiming process's heartbeat id. */
  readonly owner: string | null
  /** ISO instant, or null for the database's now() (tests move the clock). */
  readonly now: string | null
  /** The TTL this key is claimed with: its stale_at is the claim's instant plus this. */
  readonly ttl: number
  /** A route-chosen summary of the request (customer, amount) for operators. */
  readonly summary: Readonly<Record<string, string | number | boolean | null>> | null
  /** The HTTP request's id (its log lines' `request_id`), shown to operators with the key. */
  readonly http_request_id: string | null
  /**
   * The id of the request the key is bound to (its downstream key's seed), if
   * this member inserts the key. Time-ordered (UUID v7): the answers table is
   * keyed by it (sql/engine/00020), and its index then grows at its right
   * edge, its pages filled, instead of splitting at random. @default a random one (v4)
   */
  readonly request_id?: string
}

export interface ClaimRow {
  /** The member's position in the batch. */
  n: number
  /** This member inserted the key. */
  fresh: boolean
  lease: string
  attempts: number
  request_id: string
  status: 'processing' | 'done' | 'released'
  fingerprint: string
  /** Since the current lease was taken. */
  age_seconds: number
  /** Until stale_at (negative once past it); 0 when not processing. */
  ttl_left_seconds: number
  /** Processing and past its stale_at. */
  stale: boolean
  /** Since completion (done) or release (released): retention counts from there. */
  completed_age_seconds: number | null
  response_status: number | null
  response_headers: Record<string, string> | null
  response_body: string | null
  /** A processing key's request still runs somewhere (processes.ts); true otherwise. */
  worked_on: boolean
}

/**
 * $1: the members, a JSON array of ClaimMember with their position `n`.
 *
 * One statement for a whole batch of claims (claim.ts), autocommit:
 *
 * - `fresh` inserts, in key order, every member's key the statement's snapshot does not see,
 *   and lists it among the keys in processing under its deadline
 *   (idempotency_processing). ON CONFLICT DO NOTHING skips a second member of
 *   the same key in this INSERT, as it skips a key another statement inserted
 *   meanwhile: one row per key, whose lease says which member won.
 * - Each member then gets one row: the key it or an earlier member of the
 *   batch inserted (`fresh` only for the one whose lease it is), or the row
 *   as the snapshot sees it. A member with no row conflicted with a key
 *   committed after the snapshot: claim.ts asks again.
 *
 * Why the insert is attempted only for keys the snapshot does not see: ON
 * CONFLICT's uniqueness check waits for a transaction that has updated the
 * conflicting row and not yet committed (a transactional completion between
 * its fence and its COMMIT, frozen half-open: every retry then waited
 * lock_timeout holding a pooled connection, found by
 * test/chaos/half-open.test.ts). Skipping the insert for a visible row never
 * waits; the snapshot can only miss a row committed just after it was taken,
 * which ends in another round.
 *
 * `seen` reads each member's key as the snapshot sees it, by one
 * primary-key probe: a LATERAL subquery with a LIMIT is never flattened into
 * a join, so no plan can read the whole table for a batch (a hash anti-join
 * over a sequential scan, cached while the table was empty: issue 25). A key
 * the snapshot saw is inserted by no member, and every member of it gets
 * that row.
 *
 * `fresh` inserts in key order, the same in every statement: two batches in
 * flight that share keys would otherwise wait on each other's uncommitted
 * inserts in opposite orders, a deadlock that lock_timeout (1 s) ended as a
 * 503 (seen: 66 of 2,000 requests in test/http/storm.test.ts).
 *
 * pg_stat_activity shows a statement's first kilobyte
 * (track_activity_query_size), which ends before the INSERT: the leading
 * comment names the statement there, and no other comment is sent.
 *
 * The per-key reads are primary-key lookups; worked_on (the owner's
 * heartbeat) is read only for keys found in processing, never on the fresh
 * path. Measured here (pg_stat_statements, BENCHMARKS.md): 0.59 ms per
 * statement for 6.2 members on average, about 0.1 ms per claim.
 */
const claimCtes = (shared: boolean) => `input as (
    select i.*, coalesce(i.now, now()) as at
      from jsonb_to_recordset($1::text::jsonb) as i(n int, tenant text, key text, method text, path text, fingerprint text,
                                             lease bigint, owner uuid, now timestamptz, ttl float8, summary jsonb, http_request_id text,
                                             request_id uuid)
     where ${membersCondition(shared)}
  ),
  form as (select ${CLAIMS_APART} as apart),
  seen as (
    select i.n, k.*
      from input i
      left join lateral (
        select k.lease::text as lease, k.attempts, k.request_id::text as request_id, k.status, k.fingerprint,
               extract(epoch from (i.at - k.locked_at))::float8 as age_seconds,
               coalesce(extract(epoch from (k.stale_at - i.at))::float8, 0) as ttl_left_seconds,
               ${cutoffText('stale', 'i.at', '0')} as stale,
               extract(epoch from (i.at - coalesce(k.completed_at, k.released_at)))::float8 as completed_age_seconds,
               k.response_status, k.response_headers, k.response_body,
               (k.status <> 'processing' or ${cutoffText('workedOn', 'i.at', '0')}) as worked_on
          from ${KEY_STATES} k
         where k.tenant = i.tenant and k.key = i.key
         limit 1
      ) k on true
  ),
  fresh as (
    insert into idempotency_keys as k (tenant, key, method, path, fingerprint, digest, status, lease, owner, summary, http_request_id,
                                       request_id, created_at, locked_at, stale_at)
    select i.tenant, i.key, i.method, i.path, case when form.apart then null else i.fingerprint end,
           case when form.apart then decode(i.fingerprint, 'hex') end, case when form.apart then null else 'processing' end, i.lease,
           case when form.apart then null else i.owner end, case when form.apart then null else i.summary end,
           case when form.apart then null else i.http_request_id end,
           coalesce(i.request_id, gen_random_uuid()), i.at, case when form.apart then null else i.at end, case when form.apart then null else ${cutoffText('deadline', 'i.at', 'i.ttl')} end
      from input i join seen s on s.n = i.n cross join form
     where s.lease is null
     order by i.tenant, i.key, i.n
    on conflict (tenant, key) do nothing
    returning k.tenant, k.key, k.lease, k.attempts, k.request_id, coalesce(k.fingerprint, encode(k.digest, 'hex')) as fingerprint,
              k.digest is not null as apart
  ),
  listed as (
    insert into idempotency_processing (stale_at, tenant, key, locked_at, lease, owner, summary, http_request_id)
    select ${cutoffText('deadline', 'i.at', 'i.ttl')}, f.tenant, f.key, i.at,
           case when f.apart then f.lease end, case when f.apart then i.owner end,
           case when f.apart then i.summary end, case when f.apart then i.http_request_id end
      from fresh f join input i on i.tenant = f.tenant and i.key = f.key and i.lease = f.lease
  )`

/** Each member's row (ClaimRow), from the CTEs above. */
const claimRows = `
  select i.n, f.lease = i.lease as fresh, f.lease::text as lease, f.attempts, f.request_id::text as request_id,
         'processing' as status, f.fingerprint,
         0::float8 as age_seconds, i.ttl as ttl_left_seconds, false as stale,
         null::float8 as completed_age_seconds,
         null::int as response_status, null::jsonb as response_headers, null::text as response_body, true as worked_on
    from input i join fresh f on f.tenant = i.tenant and f.key = i.key
  union all
  select s.n, false, s.lease, s.attempts, s.request_id, s.status, s.fingerprint, s.age_seconds, s.ttl_left_seconds,
         s.stale, s.completed_age_seconds, s.response_status, s.response_headers, s.response_body, s.worked_on
    from seen s
   where s.lease is not null`

/** A statement of claims alone: one member waits on a lock as long as the session says; several, SHARED_LOCK_WAIT_MS (batch-input.ts). */
export const claimBatchSql = `/* idempotent-post: claim */
  with ${claimCtes(false)}${claimRows}`
export const sharedClaimBatchSql = `/* idempotent-post: claim */
  with ${claimCtes(true)}${claimRows}`

/**
 * Claims and completions in one statement (lane.ts): the claim's CTEs, its
 * rows as `claimed`, then the completion's (complete-rows.ts, named with a
 * prefix, its parameters from $2). Each row says which it is: a claim's row
 * (`completed` false, as claimBatchSql gives it), or the position `n` of a
 * completion whose lease held (`completed` true, the other columns null).
 *
 * The two parts touch different keys: a completion's key was claimed and
 * committed before, so a claim of it in the same statement finds it in the
 * snapshot (in processing: a 409, as if the claim ran just before the
 * completion) and inserts nothing. Take-overs of a key (reclaim.ts) are
 * statements of their own.
 */
export function claimAndCompleteSql(completionCtes: string, completedRows: string): string {
  return `/* idempotent-post: claim and complete */
  with ${claimCtes(true)},
  claimed as (${claimRows}
  ),
  ${completionCtes}
  select false as completed, c.* from claimed c
  union all
  select true, d.n, null, null, null, null, null, null, null, null, null, null, null, null, null, null from ${completedRows} d`
}
