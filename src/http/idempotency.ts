import type postgres from 'postgres'
import { Elysia } from 'elysia'
import type { TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { claim } from '../core/claim'
import { complete, type TransactionSql } from '../core/complete'
import { deadlineSignal, DeadlineExceededError, executionBudgetMs, ShuttingDownError } from '../core/deadline'
import { downstreamKey } from '../core/downstream-key'
import { DatabaseUnavailableError, IdempotencyError, LeaseLostError, SQLSTATE, isUnavailable, sqlState } from '../core/errors'
import { fingerprint } from '../core/fingerprint'
import { newLeaseId } from '../core/lease-id'
import { release, type ReleaseReason } from '../core/release'
import { completeRows, type RowWrites } from '../core/complete-rows'
import type { ClaimResult, Lease, StoredResponse } from '../core/types'
import { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS } from '../core/policy'
import { DEFAULT_MAX_BODY_BYTES, readJsonBody } from './body'
import { notify, type IdempotencyHooks, type Outcome } from './outcomes'
import { detail, IdempotencyKey, idempotentOperation, type RouteDocs } from './operation'
import { isProblemCode, problem, problemResponse, PROBLEM_CONTENT_TYPE, type Problem } from './problem'
import type { ClaimTicket, InFlight } from './in-flight'
import { log } from '../log'

/** SPEC: Idempotency-Key is 1..255 printable ASCII characters without space; the OpenAPI document shows the same pattern. */
const KEY_PATTERN = new RegExp(IdempotencyKey.pattern!)
/**
 * How long a failed request waits for its key's release before answering
 * anyway: the release is one statement; if the database cannot take it in
 * this time, the key becomes reclaimable after the TTL instead.
 */
const RELEASE_TIMEOUT_MS = 2_000
/**
 * The longest a claim may take, counted on our side, queueing for a pooled
 * connection included. A claim is one indexed statement (well under 10 ms
 * here even at 256 concurrent requests); 2 s means the write path is stuck
 * (a synchronous standby that stopped acknowledging, a saturated database),
 * and the request then answers 503 instead of hanging (SPEC: none hangs). The
 * statement may still commit later: it is then a lost claim (below).
 */
const CLAIM_TIMEOUT_MS = 2_000
/**
 * When a claim's answer was lost (its connection reset, or it timed out), the
 * key may have been claimed under our lease after all: we release it under
 * that lease, now and then twice more, in case the statement was still
 * running. A release is conditional on our lease, so it never touches another
 * request's claim. Meanwhile the heartbeat no longer lists the lease, so a
 * retry or an operator may take the key over within a beat or two anyway.
 */
const LOST_CLAIM_RELEASES_MS = [0, 1_000, 4_000] as const
export { DEFAULT_MAX_BODY_BYTES, DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS }

/** A postgres.js handle (`postgres(url)`), with the schema of sql/ applied to its database. */
export type Database = postgres.Sql<Record<string, never>>

/**
 * Two handles on one database (they may be the same one). Kept apart in the
 * service so a burst of completions never starves claims and 409s of
 * connections (invariant 6); engine's `openPools` makes both, with the session
 * settings that bound every statement and transaction (invariant 7).
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
  /**
   * Counts requests from their acceptance, so a shutdown can drain them (no
   * new claim starts while it does), and lists the leases being worked on
   * for the heartbeat (per-request liveness).
   */
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

export interface RowsContext<Body, Result> {
  readonly body: Body
  readonly tenant: string
  readonly key: string
  /** What the external step returned. */
  readonly result: Result
}

/** What a declarative recording step returns: the answer to store, and the rows to insert with it. */
export interface RowsResult extends HandlerResult {
  /**
   * Rows to insert, by table (`{ payments: [{ id, tenant, ... }] }`), in the
   * same statement that completes the key: a column a row leaves out gets
   * its default. Names are checked (lower-case identifiers).
   */
  readonly insert: RowWrites
}

/** What the route keeps of a request at claim, for operators: a few small fields (a payment's customer and amount). */
export type RequestSummary = Readonly<Record<string, string | number | boolean | null>>

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
   * The external step: foreign calls (a payment provider), with no database
   * connection held and no transaction open. Pass `signal` and
   * `idempotencyKey` on. Throwing fails the request (5xx) and releases the key.
   */
  readonly act: (context: ActContext<Body>) => Promise<Result>
  /**
   * The recording step, declarative (give this or `record`): the answer to
   * store and the rows to insert, written with the key's completion in one
   * autocommit statement, batched with other requests' (core/complete-rows.ts).
   * Two statements per fresh request in all, claim included. A status of 500
   * or more is not stored: nothing is written and the key is released.
   */
  readonly recordRows?: (context: RowsContext<Body, Result>) => RowsResult | Promise<RowsResult>
  /**
   * The recording step, transactional (give this or `recordRows`): the
   * business writes through `tx`, in the transaction that completes the key,
   * and the answer to store; for writes that need one (reads, updates,
   * several dependent statements). A status of 500 or more is not stored:
   * the writes roll back and the key is released.
   */
  readonly record?: (context: RecordContext<Body, Result>) => Promise<HandlerResult>
  /**
   * A summary of the request kept with its claim (at no extra statement), so
   * an operator can tell what a stuck or released request was: the
   * provider-side fields to look it up by. Keep it small (at most 1 kB). @default none
   */
  readonly summary?: (body: Body) => RequestSummary
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
  if (!route.record === !route.recordRows) throw new TypeError(`idempotentPost ${route.path}: give the route exactly one of record and recordRows`)
  const event = { route: route.path }

  function count(outcome: Outcome, started: number): void {
    notify('onOutcome', hooks.onOutcome, { route: route.path, outcome, seconds: (performance.now() - started) / 1000 })
  }

  async function handle(request: Request): Promise<Response> {
    const done = options.inFlight?.track(request)
    try {
      return await admit(request)
    } finally {
      done?.()
    }
  }

  async function admit(request: Request): Promise<Response> {
    const started = performance.now()
    const tenant = options.tenant(request)
    if (tenant === undefined) return problemResponse(problem('unauthorized'), { 'www-authenticate': 'Bearer' })
    const refuse = (answer: Problem, outcome: Outcome = 'invalid') => {
      count(outcome, started)
      return problemResponse(answer)
    }

    const key = request.headers.get('idempotency-key')
    const body = await readJsonBody(request, maxBodyBytes)
    if (!body.ok) return refuse(body.problem)
    if (key === null) return refuse(problem('missing-idempotency-key'))
    if (!KEY_PATTERN.test(key)) return refuse(problem('invalid-idempotency-key'))
    const valid = validate(body.value, body.text)
    if (!valid.ok) return refuse(problem('invalid-body', undefined, { errors: valid.errors }))
    // A draining server starts no new claim: nothing is stored, a retry goes to another server.
    if (options.inFlight?.draining)
      return refuse(problem('shutting-down', 'This server is stopping; nothing was done. Retry with the same Idempotency-Key.'), 'failed')

    const method = request.method.toUpperCase()
    const path = requestPath(request)
    const identity = { tenant, key, method, path, fingerprint: fingerprint(method, path, body.value) }

    // The lease is ours before the claim is sent: listed with the heartbeat
    // from now on, and known to us if the claim's answer never arrives.
    const leaseId = newLeaseId()
    const ticket = options.inFlight?.claiming(leaseId)
    // The deadline takes a claim still queued for its statement out of the queue (it is never sent).
    const claimDeadline = AbortSignal.timeout(CLAIM_TIMEOUT_MS)
    const claiming = claim(pools.short, identity, {
      ttlSeconds, retentionSeconds, now: options.now?.(), owner: options.owner?.(), lease: leaseId, summary: route.summary?.(valid.value) ?? null,
    }, { signal: claimDeadline })
    let claimed: ClaimResult
    try {
      claimed = await withTimeout(claiming, CLAIM_TIMEOUT_MS, () => new DatabaseUnavailableError(new Error(`the claim got no answer within ${CLAIM_TIMEOUT_MS} ms`)))
    } catch (error) {
      ticket?.end()
      recoverLostClaim({ tenant, key, lease: leaseId }, claiming)
      // Past the deadline, whichever timer fired first (ours, or the queue's abort), the database did not answer in time.
      return failure(claimDeadline.aborted && !isUnavailable(error) ? new DatabaseUnavailableError(error) : error, started, 'lost-claim')
    }
    switch (claimed.kind) {
      case 'replay':
        ticket?.end()
        count('replayed', started)
        return replay(claimed.response)
      case 'in_progress':
        ticket?.end()
        count('in_progress', started)
        return problemResponse({ ...problem('in-progress'), retryAfterSeconds: claimed.retryAfterSeconds })
      case 'mismatch':
        ticket?.end()
        count('mismatch', started)
        return problemResponse(problem('idempotency-key-reused'))
      case 'created':
      case 'reclaimed':
        if (claimed.kind === 'reclaimed') notify('onReclaim', hooks.onReclaim, event)
        return run(claimed.lease, claimed.kind, request, valid.value, started, ticket)
    }
  }

  async function run(lease: Lease, outcome: 'created' | 'reclaimed', request: Request, body: Body, started: number, ticket: ClaimTicket | undefined): Promise<Response> {
    const deadline = deadlineSignal(budgetMs)
    ticket?.hold(lease, deadline.abort)
    let completing = false
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
      // The completing phase: one statement (or one short transaction), fenced by the lease.
      const stored = await completeWith(lease, body, result, () => { completing = true })
      count(outcome, started)
      return new Response(stored.body, { status: stored.status, headers: stored.headers })
    } catch (error) {
      if (error instanceof LeaseLostError) {
        notify('onLeaseLost', hooks.onLeaseLost, event)
        count('lease_lost', started)
        return problemResponse(problem('lease-lost'))
      }
      const released = await releaseQuietly(lease, reasonOf(error))
      if (released) notify('onRelease', hooks.onRelease, event)
      // A completion whose answer was lost may have committed: then the key is
      // done (not ours to release any more), and a retry replays it at once.
      const state = released ? 'released' : completing && isUnavailable(error) ? 'unknown' : 'kept'
      return failure(error, started, state)
    } finally {
      deadline.clear()
      ticket?.end()
    }
  }

  /**
   * A claim that failed (reset, terminated, timed out) may have committed:
   * release the key under our lease, when its late answer arrives and a few
   * times over (LOST_CLAIM_RELEASES_MS). Every step is caught: nothing here
   * may reject unhandled (invariant 9).
   */
  function recoverLostClaim(lease: Pick<Lease, 'tenant' | 'key' | 'lease'>, claiming: Promise<ClaimResult>): void {
    const giveBack = () => release(pools.short, lease, 'lost_claim').then((released) => {
      if (released) notify('onRelease', hooks.onRelease, event)
      return released
    }, () => false)
    claiming.then((late) => {
      if (late.kind === 'created' || late.kind === 'reclaimed') void giveBack()
    }, () => undefined)
    let attempt = 0
    const next = () => {
      const wait = LOST_CLAIM_RELEASES_MS[attempt++]
      if (wait === undefined) return
      const timer = setTimeout(() => void giveBack().then((released) => { if (!released) next() }), wait)
      timer.unref?.()
    }
    next()
  }

  /** The recording step and the completion, in the route's form; `sending` is called as the completion goes to the database. */
  async function completeWith(lease: Lease, body: Body, result: Result, sending: () => void): Promise<StoredResponse> {
    const now = options.now?.()
    const context = { body, tenant: lease.tenant, key: lease.key, result }
    if (route.recordRows) {
      const answer = await route.recordRows(context)
      const response = toStored(answer)
      if (answer.status >= 500) throw new FailedResult(response)
      sending()
      return completeRows(pools.work, lease, response, answer.insert, { now })
    }
    sending()
    return complete(pools.work, lease, async (tx) => {
      const answer = await route.record!({ ...context, tx })
      const response = toStored(answer)
      if (answer.status >= 500) throw new FailedResult(response)
      return response
    }, { now })
  }

  async function releaseQuietly(lease: Lease, reason: ReleaseReason): Promise<boolean> {
    let timer: ReturnType<typeof setTimeout> | undefined
    const timeout = new Promise<false>((resolve) => { timer = setTimeout(() => resolve(false), RELEASE_TIMEOUT_MS) })
    try {
      return await Promise.race([release(pools.short, lease, reason).catch(() => false), timeout])
    } finally {
      clearTimeout(timer)
    }
  }

  /**
   * What became of the key, for the answer's detail:
   * - lost-claim: the claim failed; if it committed anyway, it is released under our lease;
   * - released: given back, a retry runs again;
   * - kept: the release failed, so the key becomes reclaimable (at the latest after the TTL);
   * - unknown: the completion's answer was lost: it may have committed.
   */
  function failure(error: unknown, started: number, key: 'lost-claim' | 'released' | 'kept' | 'unknown'): Response {
    count('failed', started)
    const after = {
      'lost-claim': 'retry with the same Idempotency-Key',
      released: 'the idempotency key was released, so a retry runs again',
      kept: `the idempotency key could not be released now; a retry can take it over within ${ttlSeconds} s`,
      unknown: 'the outcome is unknown; retry with the same Idempotency-Key: a stored answer is replayed, otherwise the request runs again',
    }[key]
    if (error instanceof FailedResult)
      return new Response(error.response.body, { status: error.response.status, headers: error.response.headers })
    if (error instanceof DeadlineExceededError)
      return problemResponse(problem('deadline-exceeded', `Processing ran into its deadline and was stopped; ${after}.`))
    if (error instanceof ShuttingDownError)
      return problemResponse(problem('shutting-down', `This server stopped before the request finished; ${after}.`))
    if (key === 'unknown')
      return problemResponse({ ...problem('database-unavailable', `The database did not confirm the completion; ${after}.`), retryAfterSeconds: 1 })
    if (isUnavailable(error) || sqlState(error) === SQLSTATE.QUERY_CANCELED)
      return problemResponse(problem('database-unavailable', `The database is unavailable; ${after}.`))
    // Our own writes waited on a lock for lock_timeout: the request failed (its key was released), nothing is in progress.
    if (sqlState(error) === SQLSTATE.LOCK_NOT_AVAILABLE)
      return problemResponse({ ...problem('database-unavailable', `A database lock was not obtained in time; ${after}.`), retryAfterSeconds: 1 })
    // An error with a catalogued code (e.g. provider-failed, 502) is answered as such; any other is internal.
    const code = error instanceof IdempotencyError ? error.code.toLowerCase().replaceAll('_', '-') : ''
    if (error instanceof IdempotencyError && error.status >= 500 && isProblemCode(code))
      return problemResponse(problem(code, `${error.message}; ${after}.`))
    log.error('processing failed', { route: route.path, error })
    return problemResponse(problem('internal', `Processing failed; ${after}.`))
  }

  return new Elysia({ name: 'idempotent-post', seed: route.path })
    .post(route.path, function idempotentHandler({ request }) { return handle(request) }, {
      parse: 'none',
      detail: detail(idempotentOperation(route.body, route.docs ?? {}, ttlSeconds)),
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

/** Why a failed request's key is released, for operators (a deadline may be followed by a late charge). */
function reasonOf(error: unknown): ReleaseReason {
  if (error instanceof DeadlineExceededError) return 'deadline'
  if (error instanceof ShuttingDownError) return 'shutdown'
  return 'failed'
}

/** `work`, or `timeout()`'s error after `ms`; the work goes on (its late result is the caller's to handle). */
function withTimeout<T>(work: Promise<T>, ms: number, timeout: () => Error): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const expired = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(timeout()), ms) })
  return Promise.race([work, expired]).finally(() => clearTimeout(timer))
}
