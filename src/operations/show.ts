import { downstreamKey } from '../core/downstream-key'
import { workedOnCondition, expired, forceExpirable, ownerAliveCondition, PROCESS_ALIVE_SECONDS, releasedExpired, retentionEndOf, stale } from '../core/policy'
import type { KeyStatus } from '../core/types'
import type { ReleaseReason } from '../core/release'
import type { OperationsContext } from './context'
import { KEY_STATES } from '../core/key-states'

/** What a force-expire of this key would do now (the confirmation step shows it). */
export type ExpirePreview =
  /** Processing, and past its deadline or its owner is gone: it would be released. */
  | 'expire'
  /** Processing, within its deadline, owner alive: it would be refused. */
  | 'worker_alive'
  /** Not processing (done or released): nothing to expire. */
  | 'not_processing'

export interface OwnerProcess {
  readonly id: string
  /** Absent when the process row is gone (the process stopped cleanly, or a day passed). */
  readonly pid: number | null
  readonly hostname: string | null
  readonly startedAt: Date | null
  /** Its last heartbeat; for a process that stopped cleanly, its stop (the row's own beat is dated back to say gone). */
  readonly heartbeatAt: Date | null
  readonly heartbeatAgeSeconds: number | null
  /** When it stopped cleanly (sql/engine/00019), or null: it runs, died, or was of an earlier release. */
  readonly stoppedAt: Date | null
  /** A heartbeat within PROCESS_ALIVE_SECONDS. */
  readonly alive: boolean
}

export interface PaymentSummary {
  readonly id: string
  readonly amount: string
  readonly currency: string
  readonly customer: string
  readonly description: string | null
  readonly status: string
  readonly providerReference: string
  readonly createdAt: Date
}

export interface KeyDetail {
  readonly tenant: string
  readonly key: string
  readonly status: KeyStatus
  readonly method: string
  readonly path: string
  /** sha256 of method, path and canonical body: what the service keeps of the request. */
  readonly fingerprint: string
  readonly lease: string
  readonly attempts: number
  /** The logical request; kept across reclaims and releases of the same request. */
  /** The execution's own id: what the downstream key is made of. */
  readonly requestId: string
  /** The id of the HTTP request that last ran it (its X-Request-Id, or the one answered with): the id of its log lines; null from releases before 0.3. */
  readonly httpRequestId: string | null
  /** The Idempotency-Key the service sends the provider for this request (downstream-key.ts): ask the provider with it. */
  readonly downstreamKey: string
  readonly createdAt: Date
  readonly lockedAt: Date
  readonly completedAt: Date | null
  readonly releasedAt: Date | null
  /** Released only: why (core/release.ts); null when an operator released it (see the audit trail). */
  readonly releaseReason: ReleaseReason | null
  /**
   * What the route stored of the request at claim (payments: customer,
   * amount, currency): known from the first instant, before any payment
   * exists, so a stuck or released key can be looked up at the provider.
   */
  readonly summary: Readonly<Record<string, unknown>> | null
  /** Seconds since the current lease was taken. */
  readonly ageSeconds: number
  readonly stale: boolean
  /** Processing only: when the lease reaches its TTL (stale_at; the worker stops a margin before). */
  readonly deadline: Date | null
  /** Processing only: a live request works on it (its owner lists the lease); false when its claim's answer was lost or its owner is gone. */
  readonly workedOn: boolean

  /** Done and released only: when the key leaves its retention (no longer replayed, purged). */
  readonly retentionEndsAt: Date | null
  readonly pastRetention: boolean
  /** The process holding the lease; null when nobody holds it, or the claimer had no heartbeat. */
  readonly owner: OwnerProcess | null
  readonly expirePreview: ExpirePreview
  /** Done only: the stored answer that is replayed (its body cut to MAX_BODY_SHOWN characters). */
  readonly response: { readonly status: number; readonly body: string; readonly truncated: boolean } | null
  /** Done only, when its answer names a payment of this tenant made under this key. */
  readonly payment: PaymentSummary | null
}

/** Enough of a stored answer to read it; the rest is the same payment JSON. */
export const MAX_BODY_SHOWN = 4_000
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

interface Row {
  tenant: string
  key: string
  status: KeyStatus
  method: string
  path: string
  fingerprint: string
  lease: string
  attempts: number
  request_id: string
  http_request_id: string | null
  owner: string | null
  created_at: Date
  locked_at: Date
  completed_at: Date | null
  released_at: Date | null
  release_reason: ReleaseReason | null
  summary: Record<string, unknown> | null
  response_status: number | null
  response_body: string | null
  age_seconds: number
  stale: boolean
  expirable: boolean
  past_retention: boolean
  owner_alive: boolean
  pid: number | null
  hostname: string | null
  started_at: Date | null
  heartbeat_at: Date | null
  heartbeat_age_seconds: number | null
  stopped_at: Date | null
  stale_at: Date | null
  worked_on: boolean
}

/**
 * One key in any state, with what an operator needs to decide about it: its
 * lease and attempts, its owner process and heartbeat, its deadline, what a
 * force-expire would do now (the same conditions force-expire.ts acts on),
 * the downstream key to ask the provider with, and for a completed payment
 * the payment itself. Reads only: a primary-key lookup, the owner's row, and
 * for a done key the payment by its id.
 *
 * What it shows of the request before it completes is the route's summary,
 * stored by the claim (sql/engine/00005); the service keeps no body, only its
 * fingerprint.
 */
export async function showKey(context: OperationsContext, tenant: string, key: string): Promise<KeyDetail | undefined> {
  const { sql } = context
  const now = context.now?.() ?? null
  const [row] = await sql<Row[]>`
    with params as (select coalesce(${now}::timestamptz, now()) as now)
    select k.tenant, k.key, k.status, k.method, k.path, k.fingerprint, k.lease::text as lease, k.attempts,
           k.request_id::text as request_id, k.http_request_id, k.owner::text as owner,
           k.created_at, k.locked_at, k.completed_at, k.released_at, k.release_reason, k.summary, k.response_status,
           left(k.response_body, ${MAX_BODY_SHOWN + 1}) as response_body,
           greatest(0, extract(epoch from (params.now - k.locked_at)))::float8 as age_seconds,
           ${stale(sql, sql`params.now`)} as stale,
           (k.status = 'processing' and ${forceExpirable(sql, now)}) as expirable,
           (k.status = 'processing' and ${workedOnCondition(sql, now)}) as worked_on,
           k.stale_at,
           (${expired(sql, sql`params.now`, context.retentionSeconds)} or ${releasedExpired(sql, sql`params.now`, context.retentionSeconds)}) as past_retention,
           ${ownerAliveCondition(sql, now)} as owner_alive,
           pr.pid, pr.hostname, pr.started_at, coalesce(pr.stopped_at, pr.heartbeat_at) as heartbeat_at, pr.stopped_at,
           greatest(0, extract(epoch from (params.now - coalesce(pr.stopped_at, pr.heartbeat_at))))::float8 as heartbeat_age_seconds
      from ${sql.unsafe(KEY_STATES)} k
     cross join params
      left join idempotency_processes pr on pr.id = k.owner
     where k.tenant = ${tenant} and k.key = ${key}`
  if (!row) return undefined
  const payment = row.status === 'done' ? await paymentOf(context, row) : null
  const body = row.response_body
  return {
    tenant: row.tenant,
    key: row.key,
    status: row.status,
    method: row.method,
    path: row.path,
    fingerprint: row.fingerprint,
    lease: row.lease,
    attempts: row.attempts,
    requestId: row.request_id,
    httpRequestId: row.http_request_id,
    downstreamKey: downstreamKey({ tenant: row.tenant, key: row.key, requestId: row.request_id }),
    createdAt: row.created_at,
    lockedAt: row.locked_at,
    completedAt: row.completed_at,
    releasedAt: row.released_at,
    releaseReason: row.status === 'released' ? row.release_reason : null,
    summary: row.summary,
    ageSeconds: row.age_seconds,
    stale: row.stale,
    deadline: row.stale_at,
    workedOn: row.worked_on,
    retentionEndsAt: row.completed_at ?? row.released_at ? retentionEndOf((row.completed_at ?? row.released_at)!, context.retentionSeconds) : null,
    pastRetention: row.past_retention,
    owner: row.owner === null ? null : {
      id: row.owner,
      pid: row.pid,
      hostname: row.hostname,
      startedAt: row.started_at,
      heartbeatAt: row.heartbeat_at,
      heartbeatAgeSeconds: row.heartbeat_age_seconds,
      stoppedAt: row.stopped_at,
      alive: row.owner_alive,
    },
    expirePreview: row.status !== 'processing' ? 'not_processing' : row.expirable ? 'expire' : 'worker_alive',
    response: row.response_status !== null && body !== null
      ? { status: row.response_status, body: body.slice(0, MAX_BODY_SHOWN), truncated: body.length > MAX_BODY_SHOWN }
      : null,
    payment,
  }
}

/** The payment a completed key's stored answer names (its `id`), if it is this tenant's and was made under this key. */
async function paymentOf(context: OperationsContext, row: Row): Promise<PaymentSummary | null> {
  let id: unknown
  try {
    id = (JSON.parse(row.response_body ?? '') as { id?: unknown }).id
  } catch {
    return null
  }
  if (typeof id !== 'string' || !UUID.test(id)) return null
  // An app on the plugin has no payments table (the service's migration line): its keys name no payment.
  const [table] = await context.sql<{ found: boolean }[]>`select to_regclass('payments') is not null as found`
  if (!table?.found) return null
  const [payment] = await context.sql<{ id: string; amount: string; currency: string; customer: string; description: string | null; status: string; provider_ref: string; created_at: Date }[]>`
    select id::text, amount::text, currency, customer, description, status, provider_ref, created_at
      from payments
     where id = ${id} and tenant = ${row.tenant} and idempotency_key = ${row.key}`
  return payment
    ? { id: payment.id, amount: payment.amount, currency: payment.currency, customer: payment.customer, description: payment.description, status: payment.status, providerReference: payment.provider_ref, createdAt: payment.created_at }
    : null
}

/** Why an owner counts as gone: for the detail page and the CLI. */
export const OWNER_ALIVE_SECONDS = PROCESS_ALIVE_SECONDS
