import type postgres from 'postgres'
import { Elysia } from 'elysia'
import type { TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { claim } from '../core/claim'
import { complete, type TransactionSql } from '../core/complete'
import { deadlineSignal, DeadlineExceededError, executionBudgetMs, ShuttingDownError } from '../core/deadline'
import { downstreamKey } from '../core/downstream-key'
import { IdempotencyError, LeaseLostError, SQLSTATE, isUnavailable, sqlState } from '../core/errors'
import { fingerprint } from '../core/fingerprint'
import { release } from '../core/release'
import type { ClaimResult, Lease, StoredResponse } from '../core/types'
import { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS } from '../core/policy'
import { DEFAULT_MAX_BODY_BYTES, readJsonBody } from './body'
import { notify, type IdempotencyHooks, type Outcome } from './outcomes'
import { parseIdempotencyKey } from './idempotency-key'
import { detail, idempotentOperation, type RouteDocs } from './operation'
import { PLUGIN_PROBLEMS, problem, ProblemError, problemResponse, PROBLEM_CONTENT_TYPE, type Problem, type ProblemCatalogue } from './problem'
import type { InFlight } from './in-flight'

/**
 * How long a failed request waits for its key's release before answering
 * anyway: the release is one statement; if the database cannot take it in
 * this time, the key becomes reclaimable after the TTL instead.
 */
const RELEASE_TIMEOUT_MS = 2_000
export { DEFAULT_MAX_BODY_BYTES, DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS }

/** A postgres.js handle (`postgres(url)`), with the schema of sql/ applied to its database. */
export type Database = postgres.Sql<Record<string, never>>

/**
 * Two handles on one database (they may be the same one). Kept apart in the
 * service so a burst of completions never starves claims and 409s of
 * connections (No blocked connections, docs/invariants.md); engine's `openPools` makes both, with the session
 * settings that bound every statement and transaction (Bounded processing).
 */
export interface IdempotencyPools {
  /** Single statements in autocommit: claims, replays, releases. */
  readonly short: Database
  /** The completing transactions, each held for a couple of round trips. */
  readonly work: Database
}

export interface IdempotencyOptions {
  readonly pools: IdempotencyPools
  /** The tenant of a request (from its credentials), or undefined for 401. Keys are scoped by it. */
  readonly tenant: (request: Request) => string | undefined
  /** The longest a request may process; a processing key older than this may be reclaimed. @default 30 */
  readonly ttlSeconds?: number
  /** How long a completed key is replayed. @default 86400 */
  readonly retentionSeconds?: number
  /** Larger bodies get 413. @default 65536 */
  readonly maxBodyBytes?: number
  /** Told each request's outcome, reclaims, lost claims and releases (for metrics). @default none */
  readonly hooks?: IdempotencyHooks
  /** Counts requests in flight, so a shutdown can drain them. */
  readonly inFlight?: InFlight
  /** This process's heartbeat id (core/processes.ts), recorded as the owner of the keys it claims. */
  readonly owner?: () => string | undefined
  /** Tests move the clock with this instead of sleeping. @default the database's now() */
  readonly now?: () => Date | undefined
}

/** What the recording step returns: stored and replayed byte for byte, 4xx included (a business refusal). */
export interface HandlerResult {
  readonly status: number
  readonly body: unknown
  readonly headers?: Readonly<Record<string, string>>
}

export interface ActContext<Body> {
  readonly body: Body
  readonly tenant: string
  readonly key: string
  readonly request: Request
  /** Fires at the request's deadline, a little before the key's TTL ends: pass it to every foreign call. */
  readonly signal: AbortSignal
  /**
   * Send this to the foreign service as its idempotency key. It is the same on
   * every re-execution of this request (a reclaim, a retry after a failure or
   * a lost answer), so the service returns what it did the first time instead
   * of doing it again; it differs between tenants and between requests.
   */
  readonly idempotencyKey: string
  /** 1 for the first execution of this request, more for re-executions. */
  readonly attempt: number
}

export interface RecordContext<Body, Result> {
  readonly body: Body
  readonly tenant: string
  readonly key: string
  /** What the external step returned. */
  readonly result: Result
  /** The transaction that completes the key: write the entities in it, and nothing slow. */
  readonly tx: TransactionSql
}

export type Validation<Body> = { ok: true; value: Body } | { ok: false; errors: string[] }

export interface IdempotentRoute<Body, Result> {
  /** Route path, also the `route` of the hooks' events. */
  readonly path: string
  /**
   * The body's schema (TypeBox, i.e. JSON Schema): checks the body when no
   * `validate` is given, and is the request body of the OpenAPI document.
   */
  readonly body?: TSchema & { static: Body }
  /** Checks the parsed JSON body (`text`: as sent); errors become a 400 and nothing is stored. @default checks `body` */
  readonly validate?: (body: unknown, text: string) => Validation<Body>
  /** What the OpenAPI document says of this route besides what the plugin knows: its own answers (the 201), summary, tags. */
  readonly docs?: RouteDocs
  /**
   * The route's own problem codes (`defineProblems`): an error thrown by `act`
   * whose `code` is one of them (an IdempotencyError's `PROVIDER_FAILED` is
   * `provider-failed`) is answered with it. A `ProblemError` is answered with
   * its problem whatever its catalogue. @default the plugin's codes only
   */
  readonly problems?: ProblemCatalogue<string>
  /**
   * The external step: foreign calls (a payment provider), with no database
   * connection held and no transaction open. Pass `signal` and
   * `idempotencyKey` on. Throwing fails the request (5xx) and releases the key.
   */
  readonly act: (context: ActContext<Body>) => Promise<Result>
  /**
   * The recording step: the business writes, through `tx`, in the transaction
   * that completes the key, and the answer to store. A status of 500 or more
   * is not stored: the writes roll back and the key is released.
   */
  readonly record: (context: RecordContext<Body, Result>) => Promise<HandlerResult>
}

/** A recording step answered 5xx: its writes roll back, the key is released, the answer goes out once. */
class FailedResult extends Error {
  constructor(readonly response: StoredResponse) {
    super(`the handler answered ${response.status}`)
  }
}

/**
 * Makes a JSON POST route idempotent: `app.use(idempotentPost(options, route))`.
 *
 * Atomic phases: the key is claimed in one statement; the route's external
 * step runs with no connection held, under a deadline and with a downstream
 * idempotency key; then one short transaction writes the entities and
 * completes the key, fenced by the lease. Retries get the stored answer
 * (replay), 409 while the first is in flight, 422 for a different request
 * under the same key. Each outcome maps to one status below.
 */
export function idempotentPost<Body, Result>(options: IdempotencyOptions, route: IdempotentRoute<Body, Result>) {
  const ttlSeconds = options.ttlSeconds ?? DEFAULT_TTL_SECONDS
  const retentionSeconds = options.retentionSeconds ?? DEFAULT_RETENTION_SECONDS
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES
  const budgetMs = executionBudgetMs(ttlSeconds)
  const { pools, hooks = {} } = options
  const validate = route.validate ?? schemaValidator(route.body)
  const catalogue: ProblemCatalogue<string> = route.problems ? PLUGIN_PROBLEMS.with(route.problems) : PLUGIN_PROBLEMS
  const event = { route: route.path }

  function count(outcome: Outcome, started: number): void {
    notify('onOutcome', hooks.onOutcome, { route: route.path, outcome, seconds: (performance.now() - started) / 1000 })
  }

  async function handle(request: Request): Promise<Response> {
    const started = performance.now()
    const tenant = options.tenant(request)
    if (tenant === undefined) return problemResponse(problem('unauthorized'), { 'www-authenticate': 'Bearer' })
    const refuse = (answer: Problem, outcome: Outcome = 'invalid') => {
      count(outcome, started)
      return problemResponse(answer)
    }

    const field = parseIdempotencyKey(request.headers.get('idempotency-key'))
    const body = await readJsonBody(request, maxBodyBytes)
    if (!body.ok) return refuse(body.problem)
    if (!field.ok) return refuse(problem(field.reason === 'missing' ? 'missing-idempotency-key' : 'invalid-idempotency-key'))
    const { key } = field
    const valid = validate(body.value, body.text)
    if (!valid.ok) return refuse(problem('invalid-body', undefined, { errors: valid.errors }))

    const method = request.method.toUpperCase()
    const path = requestPath(request)
    const identity = { tenant, key, method, path, fingerprint: fingerprint(method, path, body.value) }

    let claimed: ClaimResult
    try {
      claimed = await claim(pools.short, identity, { ttlSeconds, retentionSeconds, now: options.now?.(), owner: options.owner?.() })
    } catch (error) {
      return failure(error, started, undefined)
    }
    switch (claimed.kind) {
      case 'replay':
        count('replayed', started)
        return replay(claimed.response)
      case 'in_progress':
        count('in_progress', started)
        return problemResponse({ ...problem('in-progress'), retryAfterSeconds: claimed.retryAfterSeconds })
      case 'mismatch':
        count('mismatch', started)
        return problemResponse(problem('idempotency-key-reused'))
      case 'created':
      case 'reclaimed':
        if (claimed.kind === 'reclaimed') notify('onReclaim', hooks.onReclaim, event)
        return run(claimed.lease, claimed.kind, request, valid.value, started)
    }
  }

  async function run(lease: Lease, outcome: 'created' | 'reclaimed', request: Request, body: Body, started: number): Promise<Response> {
    const deadline = deadlineSignal(budgetMs)
    const done = options.inFlight?.enter(lease, deadline.abort)
    try {
      // The external phase: no connection held, no transaction open.
      const result = await untilAborted(route.act({
        body,
        tenant: lease.tenant,
        key: lease.key,
        request,
        signal: deadline.signal,
        idempotencyKey: downstreamKey(lease),
        attempt: lease.attempts,
      }), deadline.signal)
      // The completing phase: one short transaction, fenced by the lease.
      const stored = await complete(pools.work, lease, async (tx) => {
        const answer = await route.record({ body, tenant: lease.tenant, key: lease.key, result, tx })
        const response = toStored(answer)
        if (answer.status >= 500) throw new FailedResult(response)
        return response
      }, { now: options.now?.() })
      count(outcome, started)
      return new Response(stored.body, { status: stored.status, headers: stored.headers })
    } catch (error) {
      if (error instanceof LeaseLostError) {
        notify('onLeaseLost', hooks.onLeaseLost, event)
        count('lease_lost', started)
        return problemResponse(problem('lease-lost'))
      }
      const released = await releaseQuietly(lease)
      if (released) notify('onRelease', hooks.onRelease, event)
      return failure(error, started, released)
    } finally {
      deadline.clear()
      done?.()
    }
  }

  async function releaseQuietly(lease: Lease): Promise<boolean> {
    let timer: ReturnType<typeof setTimeout> | undefined
    const timeout = new Promise<false>((resolve) => { timer = setTimeout(() => resolve(false), RELEASE_TIMEOUT_MS) })
    try {
      return await Promise.race([release(pools.short, lease).catch(() => false), timeout])
    } finally {
      clearTimeout(timer)
    }
  }

  /** `released`: undefined when nothing was claimed, else whether the key was given back. */
  function failure(error: unknown, started: number, released: boolean | undefined): Response {
    count('failed', started)
    const after = released === false
      ? `the idempotency key could not be released now; it can be retried after ${ttlSeconds} s`
      : released ? 'the idempotency key was released, so a retry runs again' : 'retry with the same Idempotency-Key'
    if (error instanceof FailedResult)
      return new Response(error.response.body, { status: error.response.status, headers: error.response.headers })
    if (error instanceof DeadlineExceededError)
      return problemResponse(problem('deadline-exceeded', `Processing ran into its deadline and was stopped; ${after}.`))
    if (error instanceof ShuttingDownError)
      return problemResponse(problem('shutting-down', `This server stopped before the request finished; ${after}.`))
    if (isUnavailable(error) || sqlState(error) === SQLSTATE.QUERY_CANCELED)
      return problemResponse(problem('database-unavailable', `The database is unavailable; ${after}.`))
    if (sqlState(error) === SQLSTATE.LOCK_NOT_AVAILABLE)
      return problemResponse(problem('in-progress', 'The key is busy; retry shortly.'))
    // A problem the route chose, or an error with a catalogued code (e.g. provider-failed, 502); any other is internal.
    if (error instanceof ProblemError)
      return problemResponse({ ...error.problem, detail: `${error.problem.detail ?? error.problem.title}; ${after}.` })
    const code = error instanceof IdempotencyError ? error.code.toLowerCase().replaceAll('_', '-') : ''
    if (error instanceof IdempotencyError && error.status >= 500 && catalogue.has(code))
      return problemResponse(catalogue.problem(code, `${error.message}; ${after}.`))
    console.error(`idempotent ${route.path}: processing failed:`, error instanceof Error ? error.message : error)
    return problemResponse(problem('internal', `Processing failed; ${after}.`))
  }

  return new Elysia({ name: 'idempotent-post', seed: route.path })
    .post(route.path, function idempotentHandler({ request }) { return handle(request) }, {
      parse: 'none',
      detail: detail(idempotentOperation(route.body, route.docs ?? {}, { ttlSeconds, retentionSeconds })),
    })
}

/** The check of a TypeBox body schema, compiled once (TypeBox's checker is a generated function, ~50x faster than interpreting). */
function schemaValidator<Body>(schema: (TSchema & { static: Body }) | undefined): (body: unknown) => Validation<Body> {
  if (!schema) throw new TypeError('idempotentPost: give the route a body schema or a validate function')
  const check = TypeCompiler.Compile(schema)
  return (body) => check.Check(body)
    ? { ok: true, value: body as Body }
    : { ok: false, errors: [...check.Errors(body)].slice(0, 10).map((error) => `${error.path || '/'}: ${error.message}`) }
}

function toStored(result: HandlerResult): StoredResponse {
  const isProblem = result.status >= 400
  return {
    status: result.status,
    headers: { 'content-type': isProblem ? PROBLEM_CONTENT_TYPE : 'application/json', ...result.headers },
    body: JSON.stringify(result.body),
  }
}

/**
 * The path as the request's identity: a trailing slash does not make another
 * request (Elysia routes `/api/payments/` to the same handler), so a retry
 * sent with one is the same request, not a 422.
 */
function requestPath(request: Request): string {
  const { pathname } = new URL(request.url)
  return pathname.replace(/\/+$/, '') || '/'
}

/**
 * Settles with `work`, or rejects with the signal's reason when it fires
 * first: a handler that ignores its signal still cannot keep the request (or
 * its key) past the deadline. Its late result is dropped.
 */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason)
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason)
    signal.addEventListener('abort', onAbort, { once: true })
    work.then(
      (value) => { signal.removeEventListener('abort', onAbort); signal.aborted ? reject(signal.reason) : resolve(value) },
      (error: unknown) => { signal.removeEventListener('abort', onAbort); reject(signal.aborted ? signal.reason : error) },
    )
  })
}

function replay(response: StoredResponse): Response {
  return new Response(response.body, {
    status: response.status,
    headers: { ...response.headers, 'idempotent-replayed': 'true' },
  })
}
