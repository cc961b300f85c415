import type postgres from 'postgres'
import { Elysia } from 'elysia'
import { TransformKind, type TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { claim, inProgress } from '../core/claim'
import { complete, type TransactionSql } from '../core/complete'
import { deadlineSignal, DeadlineExceededError, executionBudgetMs, ShuttingDownError } from '../core/deadline'
import { downstreamKey } from '../core/downstream-key'
import { DatabaseUnavailableError, IdempotencyError, LeaseLostError, SQLSTATE, isUnavailable, sqlState } from '../core/errors'
import { fingerprint } from '../core/fingerprint'
import { newLeaseId } from '../core/lease-id'
import { release, type ReleaseReason } from '../core/release'
import { completionState } from '../core/completion-state'
import { recovering, type Recovery, type RetryCause, type StatementKind } from '../core/recovery'
import { ReplayCache, type SeenRequest } from './replay-cache'
import { RunningKeys } from './running-keys'
import { completeRows, type RowWrites } from '../core/complete-rows'
import type { ClaimResult, Lease, StoredResponse } from '../core/types'
import { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS } from '../core/policy'
import { DEFAULT_MAX_BODY_BYTES, parseJsonText, readJsonText } from './body'
import { notify, type IdempotencyHooks, type Outcome } from './outcomes'
import { parseIdempotencyKey } from './idempotency-key'
import { detail, idempotentOperation, type RouteDocs } from './operation'
import { PLUGIN_PROBLEMS, problem, ProblemError, problemResponse, PROBLEM_CONTENT_TYPE, type Problem, type ProblemCatalogue } from './problem'
import type { ClaimTicket, InFlight } from './in-flight'
import { problemInstance, requestIdOf, requestLogger, stampedByPlugin } from './request-id'
import { errorText, type Logger } from '../log'
import { pathnameOf } from './client'

/**
 * How long a failed request waits for its key's release before answering
 * anyway: the release is one statement; if the database cannot take it in
 * this time, the key becomes reclaimable after the TTL instead.
 */
const RELEASE_TIMEOUT_MS = 2_000
/**
 * The longest a claim may take, counted on our side, queueing for its
 * statement included. A batch of 128 claims takes a few milliseconds here, a
 * burst of 2,000 at once 0.2 s on a quiet machine and seconds on a loaded
 * one (2 s cut a loaded test's burst of 2,000 into 947 needless 503s). 5 s,
 * the statement_timeout, means the write path is stuck (a synchronous
 * standby that stopped acknowledging, a saturated database): the request
 * answers 503 instead of hanging (SPEC: none hangs), and while the database
 * is known to be away the health gate answers 503 at once anyway. The
 * statement may still commit later: it is then a lost claim (below).
 */
const CLAIM_TIMEOUT_MS = 5_000
/** 10,000 answers of about 1 kB: 10 MB at most, enough for every key of a retry storm. */
const DEFAULT_REPLAY_CACHE_ENTRIES = 10_000
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
  /** Where the line about each failed, deadline-hit or fenced request goes (with its request id). @default src/log.ts's logger */
  readonly log?: Logger
  /**
   * Completed keys' answers kept in this process, so a replay needs no
   * database (http/replay-cache.ts: safe, a done key is immutable for its
   * retention); 0 turns it off. Off when `now` moves the clock (tests). @default 10000
   */
  readonly replayCacheEntries?: number
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
  const catalogue: ProblemCatalogue<string> = route.problems ? PLUGIN_PROBLEMS.with(route.problems) : PLUGIN_PROBLEMS
  const event = { route: route.path }
  const cache = options.now ? undefined : new ReplayCache(options.replayCacheEntries ?? DEFAULT_REPLAY_CACHE_ENTRIES)
  // Keys this process runs now: their retries here are answered without a claim statement.
  const running = options.now ? undefined : new RunningKeys()

  function count(outcome: Outcome, started: number): void {
    notify('onOutcome', hooks.onOutcome, { route: route.path, outcome, seconds: (performance.now() - started) / 1000 })
  }

  async function handle(request: Request): Promise<Response> {
    const done = options.inFlight?.track(request)
    try {
      const answer = stampedByPlugin(request, await admit(request))
      return answer instanceof Response ? answer : await answer // no extra hop when the edge stamps it
    } finally {
      done?.()
    }
  }

  async function admit(request: Request): Promise<Response> {
    const started = performance.now()
    const tenant = options.tenant(request)
    if (tenant === undefined) return problemResponse(problem('unauthorized'), { 'www-authenticate': 'Bearer' })
    const rawKey = request.headers.get('idempotency-key')
    const refuse = (answer: Problem, outcome: Outcome = 'invalid') => {
      count(outcome, started)
      // Debug only: a refusal is the client's mistake, and hostile clients can send many (the key, as sent, is escaped: log.ts).
      requestLogger(request, { tenant, route: route.path, ...(rawKey === null ? {} : { key: rawKey }) }, options.log).debug(`refused: ${answer.code}`, { outcome, status: answer.status })
      return problemResponse(answer)
    }

    const field = parseIdempotencyKey(rawKey)
    const read = await readJsonText(request, maxBodyBytes)
    if (!read.ok) return refuse(read.problem)
    const sent = { path: requestPath(request), text: read.text }
    const draining = options.inFlight?.draining === true
    // A retry of a finished key, sent as its first request was to the byte: its answer from memory, unparsed.
    const same = field.ok && !draining ? cache?.sameAs(tenant, field.key, sent) : undefined
    if (same) {
      count('replayed', started)
      return replay(same.response)
    }
    const body = parseJsonText(read.text)
    if (!body.ok) return refuse(body.problem)
    if (!field.ok) return refuse(problem(field.reason === 'missing' ? 'missing-idempotency-key' : 'invalid-idempotency-key'))
    const { key } = field
    const valid = validate(body.value, body.text)
    if (!valid.ok) return refuse(problem('invalid-body', undefined, { errors: valid.errors }))
    // A draining server starts no new claim: nothing is stored, a retry goes to another server.
    if (draining)
      return refuse(problem('shutting-down', 'This server is stopping; nothing was done. Retry with the same Idempotency-Key.'), 'failed')

    const method = request.method.toUpperCase()
    const { path } = sent
    const identity = { tenant, key, method, path, fingerprint: fingerprint(method, path, body.value) }
    const seen = { fingerprint: identity.fingerprint, sent }
    // A finished key answers from memory: its answer, or 422 for another request under it.
    const cached = cache?.get(tenant, key)
    if (cached) {
      if (cached.fingerprint !== identity.fingerprint) {
        count('mismatch', started)
        return problemResponse(problem('idempotency-key-reused'))
      }
      count('replayed', started)
      return replay(cached.response)
    }
    // A key this process is running: 409 for its request, 422 for another, as the claim would answer.
    const mine = running?.get(tenant, key)
    if (mine) {
      if (mine.fingerprint !== identity.fingerprint) {
        count('mismatch', started)
        return problemResponse(problem('idempotency-key-reused'))
      }
      const ageSeconds = (performance.now() - mine.since) / 1000
      count('in_progress', started)
      return problemResponse({ ...problem('in-progress'), retryAfterSeconds: inProgress(ttlSeconds - ageSeconds, ageSeconds).retryAfterSeconds })
    }

    // The lease is ours before the claim is sent: listed with the heartbeat
    // from now on, and known to us if the claim's answer never arrives.
    const leaseId = newLeaseId()
    const ticket = options.inFlight?.claiming(leaseId)
    // The deadline takes a claim still queued for its statement out of the queue (it is never sent).
    const claimDeadline = AbortSignal.timeout(CLAIM_TIMEOUT_MS)
    const about: About = { request, tenant, key }
    // The key's TTL and the age of a done key are counted by the database from
    // this statement, so this process counts its deadline, its 409s and its
    // cached replay from the instant before it is sent (never later).
    const claimSentAt = performance.now()
    const claiming = claim(pools.short, identity, {
      ttlSeconds, retentionSeconds, now: options.now?.(), owner: options.owner?.(), lease: leaseId, summary: summaryOf(valid.value),
      httpRequestId: requestIdOf(request),
    }, { signal: claimDeadline, recovery: recoveryUntil(claimSentAt + CLAIM_TIMEOUT_MS) })
    let claimed: ClaimResult
    try {
      claimed = await withTimeout(claiming, CLAIM_TIMEOUT_MS, () => new DatabaseUnavailableError(new Error(`the claim got no answer within ${CLAIM_TIMEOUT_MS} ms`)))
    } catch (error) {
      ticket?.end()
      recoverLostClaim({ tenant, key, lease: leaseId }, claiming)
      // Past the deadline, whichever timer fired first (ours, or the queue's abort), the database did not answer in time.
      return failure(claimDeadline.aborted && !isUnavailable(error) ? new DatabaseUnavailableError(error) : error, started, 'lost-claim', about)
    }
    switch (claimed.kind) {
      case 'replay':
        ticket?.end()
        cache?.set(tenant, key, seen, claimed.response, retentionSeconds, claimSentAt, claimed.ageSeconds)
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
        return run(claimed.lease, claimed.kind, about, valid.value, seen, started, claimSentAt, ticket)
    }
  }

  async function run(lease: Lease, outcome: 'created' | 'reclaimed', about: About, body: Body, seen: SeenRequest, started: number, claimSentAt: number, ticket: ClaimTicket | undefined): Promise<Response> {
    const { request } = about
    const deadline = deadlineSignal(budgetMs, claimSentAt)
    ticket?.hold(lease, deadline.abort)
    const leave = running?.enter(lease.tenant, lease.key, seen.fingerprint, budgetMs, claimSentAt)
    let completing = false
    // The first attempt's: a later one may find that this one committed (recovery.ts).
    let completionSentAt: number | undefined
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
      const stored = await completeRecovering(lease, body, result, requestIdOf(request), claimSentAt + budgetMs, () => {
        completing = true
        completionSentAt ??= performance.now()
      })
      // The completion sets completed_at after completionSentAt: the entry ends before the key's retention, however late the commit's answer.
      cache?.set(lease.tenant, lease.key, seen, stored, retentionSeconds, completionSentAt!)
      count(outcome, started)
      return new Response(stored.body, { status: stored.status, headers: stored.headers })
    } catch (error) {
      if (error instanceof LeaseLostError) {
        notify('onLeaseLost', hooks.onLeaseLost, event)
        count('lease_lost', started)
        logOf(about).warn('lease lost: the key was reclaimed or force-expired while this request ran; its writes were rolled back', { outcome: 'lease_lost', attempt: lease.attempts })
        return problemResponse(problem('lease-lost'))
      }
      const reason = reasonOf(error)
      if (reason === 'deadline') notify('onDeadline', hooks.onDeadline, event)
      const released = await releaseQuietly(lease, reason)
      if (released) notify('onRelease', hooks.onRelease, { ...event, reason })
      // A completion whose answer was lost may have committed: then the key is
      // done (not ours to release any more), and a retry replays it at once.
      const state = released ? 'released' : completing && isUnavailable(error) ? 'unknown' : 'kept'
      return failure(error, started, state, about, lease)
    } finally {
      leave?.()
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
      if (released) notify('onRelease', hooks.onRelease, { ...event, reason: 'lost_claim' })
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

  /** Recovery of a statement of this route until `until` (performance.now()), counted by kind and cause. */
  function recoveryUntil(until: number): Recovery {
    return { until, onRetry: (statement: StatementKind, cause: RetryCause) => notify('onRetry', hooks.onRetry, { ...event, statement, cause }) }
  }

  /**
   * The completion, sent again while its connection fails under it and the
   * request's deadline is ahead. Before each new attempt the key is read:
   * done under our lease is the lost attempt's commit (its stored answer is
   * the answer), processing under our lease means nothing committed (the
   * recording step runs again: nothing of its last run was written), anything
   * else a lost lease. A fence that fails on a later attempt is read the same
   * way: the earlier attempt may have committed in between.
   */
  async function completeRecovering(lease: Lease, body: Body, result: Result, requestId: string, until: number, sending: () => void): Promise<StoredResponse> {
    let lost = false
    return recovering('completion', async (attempt) => {
      if (attempt > 1) {
        const state = await completionState(pools.short, lease)
        if (state.kind === 'done') return state.response
        if (state.kind === 'lost') {
          lost = true
          throw new LeaseLostError()
        }
      }
      return completeWith(lease, body, result, requestId, sending)
    }, recoveryUntil(until), (error, attempt) => !lost && (isUnavailable(error) || (error instanceof LeaseLostError && attempt > 1)))
  }

  /** The recording step and the completion, in the route's form; `sending` is called as the completion goes to the database. */
  async function completeWith(lease: Lease, body: Body, result: Result, requestId: string, sending: () => void): Promise<StoredResponse> {
    const now = options.now?.()
    const context = { body, tenant: lease.tenant, key: lease.key, result }
    if (route.recordRows) {
      const answer = await route.recordRows(context)
      const response = toStored(answer, requestId)
      if (answer.status >= 500) throw new FailedResult(response)
      sending()
      return completeRows(pools.work, lease, response, answer.insert, { now })
    }
    sending()
    return complete(pools.work, lease, async (tx) => {
      const answer = await route.record!({ ...context, tx })
      const response = toStored(answer, requestId)
      if (answer.status >= 500) throw new FailedResult(response)
      return response
    }, { now })
  }

  async function releaseQuietly(lease: Lease, reason: ReleaseReason): Promise<boolean> {
    let timer: ReturnType<typeof setTimeout> | undefined
    const timeout = new Promise<false>((resolve) => { timer = setTimeout(() => resolve(false), RELEASE_TIMEOUT_MS) })
    try {
      // A release is conditional on our lease: sending it again is safe, within its own time.
      const releasing = recovering('release', () => release(pools.short, lease, reason), recoveryUntil(performance.now() + RELEASE_TIMEOUT_MS - 250))
      return await Promise.race([releasing.catch(() => false), timeout])
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
  function failure(error: unknown, started: number, key: 'lost-claim' | 'released' | 'kept' | 'unknown', about: About, lease?: Lease): Response {
    count('failed', started)
    report(error, key, about, lease)
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
    // A problem the route chose, or an error with a catalogued code (e.g. provider-failed, 502); any other is internal.
    if (error instanceof ProblemError)
      return problemResponse({ ...error.problem, detail: `${error.problem.detail ?? error.problem.title}; ${after}.` })
    const code = error instanceof IdempotencyError ? error.code.toLowerCase().replaceAll('_', '-') : ''
    if (error instanceof IdempotencyError && error.status >= 500 && catalogue.has(code))
      return problemResponse(catalogue.problem(code, `${error.message}; ${after}.`))
    return problemResponse(problem('internal', `Processing failed; ${after}.`))
  }

  /** The request's logger: its id, tenant, route and key on every line. */
  function logOf(about: About): Logger {
    return requestLogger(about.request, { tenant: about.tenant, route: route.path, key: about.key }, options.log)
  }

  /** The route's summary of the request, bounded (it rides in every claim's INSERT); none if the route's function throws. */
  function summaryOf(body: Body): RequestSummary | null {
    if (!route.summary) return null
    try {
      const summary = route.summary(body)
      return JSON.stringify(summary).length <= MAX_SUMMARY_CHARS ? summary : null
    } catch {
      return null
    }
  }

  /** One line per failed, deadline-hit or stopped request: what failed, and what became of its key. */
  function report(error: unknown, key: 'lost-claim' | 'released' | 'kept' | 'unknown', about: About, lease: Lease | undefined): void {
    const fields = {
      outcome: 'failed',
      ...(lease ? { attempt: lease.attempts } : {}),
      key_state: { 'lost-claim': 'claim failed (released under its lease if it committed)', released: 'released', kept: 'not released (reclaimable)', unknown: 'outcome unknown (the completion may have committed)' }[key],
      error,
    }
    const logger = logOf(about)
    if (error instanceof FailedResult) logger.warn(`the handler answered ${error.response.status}`, fields)
    else if (error instanceof DeadlineExceededError) logger.warn(`deadline: processing ran into its deadline (${error.budgetMs} ms) and was stopped; a foreign call in flight may still complete (the provider may have charged)`, { ...fields, outcome: 'deadline' })
    else if (error instanceof ShuttingDownError) logger.warn('stopped by the shutdown before it finished', fields)
    else if (isUnavailable(error) || sqlState(error) === SQLSTATE.QUERY_CANCELED) logger.warn(`database unavailable: ${errorText(error)}`, fields)
    else if (error instanceof IdempotencyError && error.status >= 500) logger.warn(`${error.code.toLowerCase()}: ${error.message}`, fields)
    else logger.error(`processing failed: ${errorText(error)}`, fields)
  }

  return new Elysia({ name: 'idempotent-post', seed: route.path })
    .post(route.path, function idempotentHandler({ request }) { return handle(request) }, {
      parse: 'none',
      detail: detail(idempotentOperation(route.body, route.docs ?? {}, { ttlSeconds, retentionSeconds })),
    })
}

/**
 * The check of a TypeBox body schema, compiled once (TypeBox's checker is a
 * generated function, ~50x faster than interpreting). A schema with
 * transforms (Elysia's `t.Integer()`, `t.Numeric()` take "4" and mean 4) is
 * decoded too, so `act` gets the type the schema says: before, `"4"` passed
 * the check and reached `act` as a string while TypeScript said number.
 */
function schemaValidator<Body>(schema: (TSchema & { static: Body }) | undefined): (body: unknown) => Validation<Body> {
  if (!schema) throw new TypeError('idempotentPost: give the route a body schema or a validate function')
  const check = TypeCompiler.Compile(schema)
  const decodes = hasTransform(schema)
  return (body) => check.Check(body)
    ? { ok: true, value: (decodes ? check.Decode(body) : body) as Body }
    : { ok: false, errors: [...check.Errors(body)].slice(0, 10).map((error) => `${error.path || '/'}: ${error.message}`) }
}

/** Whether `schema`, or any schema inside it, transforms what it checks. */
function hasTransform(schema: unknown, seen = new Set<unknown>()): boolean {
  if (typeof schema !== 'object' || schema === null || seen.has(schema)) return false
  seen.add(schema)
  if (TransformKind in schema) return true
  return Object.values(schema).some((inner) => hasTransform(inner, seen))
}

/**
 * A stored problem carries its first request's `instance`, so its replays
 * are that answer byte for byte (the edge adds `instance` only where none is).
 */
function toStored(result: HandlerResult, requestId: string): StoredResponse {
  const isProblem = result.status >= 400
  const body = isProblem && isPlainObject(result.body) && !('instance' in result.body)
    ? { ...result.body, instance: problemInstance(requestId) }
    : result.body
  return {
    status: result.status,
    headers: { 'content-type': isProblem ? PROBLEM_CONTENT_TYPE : 'application/json', ...result.headers },
    body: JSON.stringify(body),
  }
}

const isPlainObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value)

/** What a request is, for its log lines. */
interface About {
  readonly request: Request
  readonly tenant: string
  readonly key: string
}

/** 1 KiB of JSON: a customer id and an amount take ~60 bytes; a route that wants more is storing the body. */
const MAX_SUMMARY_CHARS = 1024

/**
 * The path as the request's identity: a trailing slash does not make another
 * request (Elysia routes `/api/payments/` to the same handler), so a retry
 * sent with one is the same request, not a 422.
 */
function requestPath(request: Request): string {
  return pathnameOf(request).replace(/\/+$/, '') || '/'
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
