import { Elysia } from 'elysia'
import { claim } from '../core/claim'
import { IdempotencyError, LeaseLostError, SQLSTATE, isUnavailable, sqlState } from '../core/errors'
import { fingerprint } from '../core/fingerprint'
import { runWithLease, type TransactionSql } from '../core/lease'
import type { ClaimResult, Lease, StoredResponse } from '../core/types'
import type { Pools } from '../store/db'
import type { Metrics, Outcome } from '../metrics/registry'
import { readJsonBody } from './body'
import { problemResponse, problems, PROBLEM_CONTENT_TYPE, type Problem } from './problem'
import { InFlight } from './in-flight'

/** Printable ASCII without space, 1..255 characters (SPEC: Idempotency-Key). */
const KEY_PATTERN = /^[!-~]{1,255}$/
/** Seconds a client should wait before retrying while the database is away. */
const UNAVAILABLE_RETRY_AFTER = '2'

export interface IdempotencyOptions {
  readonly pools: Pools
  /** The tenant of a request (from its credentials), or undefined for 401. Keys are scoped by it. */
  readonly tenant: (request: Request) => string | undefined
  /** Age after which a processing key whose worker is gone may be reclaimed. @default 30 */
  readonly ttlSeconds?: number
  /** How long a completed key is replayed. @default 86400 */
  readonly retentionSeconds?: number
  /** Larger bodies get 413. @default 65536 */
  readonly maxBodyBytes?: number
  readonly metrics?: Metrics
  /** Counts requests in flight, so a shutdown can drain them. */
  readonly inFlight?: InFlight
  /** Tests move the clock with this instead of sleeping. @default the database's now() */
  readonly now?: () => Date | undefined
}

/** What a handler returns: stored and replayed byte for byte, 4xx included (a business refusal). */
export interface HandlerResult {
  readonly status: number
  readonly body: unknown
  readonly headers?: Readonly<Record<string, string>>
}

export interface HandlerContext<Body> {
  readonly body: Body
  /** The transaction that completes the key: write the entities in it. */
  readonly tx: TransactionSql
  readonly tenant: string
  readonly key: string
  readonly request: Request
}

export type Validation<Body> = { ok: true; value: Body } | { ok: false; errors: string[] }

export interface IdempotentRoute<Body> {
  /** Route path, also the `route` label of the metrics. */
  readonly path: string
  /** Checks the parsed JSON body; errors become a 400 and nothing is stored. */
  readonly validate: (body: unknown) => Validation<Body>
  /** Runs at most once per (tenant, key, request), unless it fails (the key is then released). */
  readonly handler: (context: HandlerContext<Body>) => Promise<HandlerResult>
}

/**
 * Makes a JSON POST route idempotent: `app.use(idempotentPost(options, route))`.
 *
 * The key is claimed before the handler runs; the handler's writes and the
 * key's completion commit together; retries get the stored answer (replay),
 * 409 while the first is in flight, 422 for a different request under the
 * same key. Each outcome maps to one status in `answer` below.
 */
export function idempotentPost<Body>(options: IdempotencyOptions, route: IdempotentRoute<Body>) {
  const ttlSeconds = options.ttlSeconds ?? 30
  const retentionSeconds = options.retentionSeconds ?? 86_400
  const maxBodyBytes = options.maxBodyBytes ?? 65_536
  const { pools, metrics } = options

  function count(outcome: Outcome, started: number): void {
    metrics?.idempotencyRequests.inc({ route: route.path, outcome })
    metrics?.idempotencyDuration.observe({ route: route.path, outcome }, (performance.now() - started) / 1000)
  }

  async function handle(request: Request): Promise<Response> {
    const started = performance.now()
    const tenant = options.tenant(request)
    if (tenant === undefined) return problemResponse(problems.unauthorized(), { 'www-authenticate': 'Bearer' })
    const refuse = (problem: Problem, outcome: Outcome = 'invalid') => {
      count(outcome, started)
      return problemResponse(problem)
    }

    const key = request.headers.get('idempotency-key')
    const body = await readJsonBody(request, maxBodyBytes)
    if (!body.ok) return refuse(body.problem)
    if (key === null) return refuse(problems.badRequest('missing-idempotency-key', 'Send an Idempotency-Key header.'))
    if (!KEY_PATTERN.test(key))
      return refuse(problems.badRequest('invalid-idempotency-key', 'Idempotency-Key must be 1 to 255 printable ASCII characters (0x21 to 0x7E), sent once.'))
    const valid = route.validate(body.value)
    if (!valid.ok) return refuse(problems.badRequest('invalid-body', 'The body does not match the schema.', valid.errors))

    const method = request.method.toUpperCase()
    const path = new URL(request.url).pathname
    const identity = { tenant, key, method, path, fingerprint: fingerprint(method, path, body.value) }
    const timing = { ttlSeconds, retentionSeconds, now: options.now?.() }

    let claimed: ClaimResult
    try {
      claimed = await claim(pools.short, identity, timing)
    } catch (error) {
      return failure(error, started)
    }
    switch (claimed.kind) {
      case 'replay':
        count('replayed', started)
        return replay(claimed.response)
      case 'in_progress':
        count('in_progress', started)
        return problemResponse(
          { code: 'in-progress', status: 409, title: 'Request in progress', detail: 'A request with this Idempotency-Key is still being processed; retry after the given seconds.' },
          { 'retry-after': String(claimed.retryAfterSeconds) },
        )
      case 'mismatch':
        count('mismatch', started)
        return problemResponse({ code: 'idempotency-key-reused', status: 422, title: 'Idempotency-Key reused', detail: 'This Idempotency-Key was used for a different request (method, path or body).' })
      case 'created':
      case 'reclaimed':
        if (claimed.kind === 'reclaimed') metrics?.reclaims.inc({ route: route.path })
        return run(claimed.lease, claimed.kind, request, valid.value, started)
    }
  }

  async function run(lease: Lease, outcome: 'created' | 'reclaimed', request: Request, body: Body, started: number): Promise<Response> {
    const done = options.inFlight?.enter(lease)
    try {
      const stored = await runWithLease(pools.work, pools.short, lease, async (tx): Promise<StoredResponse> => {
        const result = await route.handler({ body, tx, tenant: lease.tenant, key: lease.key, request })
        const isProblem = result.status >= 400
        return {
          status: result.status,
          headers: { 'content-type': isProblem ? PROBLEM_CONTENT_TYPE : 'application/json', ...result.headers },
          body: JSON.stringify(result.body),
        }
      }, { now: options.now?.() })
      count(outcome, started)
      return new Response(stored.body, { status: stored.status, headers: stored.headers })
    } catch (error) {
      if (error instanceof LeaseLostError) {
        metrics?.leasesLost.inc({ route: route.path })
        count('lease_lost', started)
        return problemResponse({ code: 'lease-lost', status: 409, title: 'Claim lost', detail: 'This request lost its claim on the key to a retry or an operator; its writes were rolled back. Retry to get the answer that counts.' }, { 'retry-after': '1' })
      }
      metrics?.releases.inc({ route: route.path })
      return failure(error, started)
    } finally {
      done?.()
    }
  }

  function failure(error: unknown, started: number): Response {
    count('failed', started)
    if (isUnavailable(error) || sqlState(error) === SQLSTATE.QUERY_CANCELED)
      return problemResponse(problems.unavailable(), { 'retry-after': UNAVAILABLE_RETRY_AFTER })
    if (sqlState(error) === SQLSTATE.LOCK_NOT_AVAILABLE)
      return problemResponse({ code: 'in-progress', status: 409, title: 'Request in progress', detail: 'The key is busy; retry shortly.' }, { 'retry-after': '1' })
    if (error instanceof IdempotencyError && error.status >= 500)
      return problemResponse({ code: error.code.toLowerCase().replaceAll('_', '-'), status: error.status, title: 'Processing failed', detail: `${error.message}; the idempotency key was released, so a retry runs again.` })
    console.error(`idempotent ${route.path}: processing failed:`, error instanceof Error ? error.message : error)
    return problemResponse(problems.internal())
  }

  return new Elysia({ name: 'idempotent-post', seed: route.path })
    .post(route.path, ({ request }) => handle(request), { parse: 'none' })
}

function replay(response: StoredResponse): Response {
  return new Response(response.body, {
    status: response.status,
    headers: { ...response.headers, 'idempotent-replayed': 'true' },
  })
}

