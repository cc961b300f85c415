import { Elysia } from 'elysia'
import { claim, inProgress } from '../core/claim'
import { deadlineSignal, executionBudgetMs, untilAborted, withTimeout } from '../core/deadline'
import { downstreamKey } from '../core/downstream-key'
import { DatabaseUnavailableError, LeaseLostError, isUnavailable } from '../core/errors'
import { fingerprint } from '../core/fingerprint'
import { newLeaseId } from '../core/lease-id'
import { release, type ReleaseReason } from '../core/release'
import { recovering, type Recovery, type RetryCause, type StatementKind } from '../core/recovery'
import type { ClaimResult, Lease, StoredResponse } from '../core/types'
import { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS } from '../core/policy'
import { ReplayCache, type SeenRequest } from './replay-cache'
import { RunningKeys } from './running-keys'
import { BusyKeys } from './busy-keys'
import { DEFAULT_MAX_BODY_BYTES, parseJsonText, readJsonText } from './body'
import { completer } from './completion'
import { failureResponse, fromEngine, releaseReasonOf, reportFailure, routeStep, type KeyState } from './failure'
import { recoverLostClaim } from './lost-claim'
import { notify, type Outcome } from './outcomes'
import { parseIdempotencyKey } from './idempotency-key'
import { detail, idempotentOperation } from './operation'
import { PLUGIN_PROBLEMS, problem, problemResponse, type Problem } from './problem'
import type { ClaimTicket } from './in-flight'
import { requestIdOf, requestLogger, stampedByPlugin } from './request-id'
import type { IdempotencyOptions, IdempotentRoute, RequestSummary } from './route'
import { schemaValidator } from './schema-validator'
import type { Logger } from '../log'
import { pathnameOf } from './client'

export type {
  ActContext, Database, HandlerResult, IdempotencyOptions, IdempotencyPools, IdempotentRoute, RecordContext, RequestSummary, RowsContext, RowsResult, Validation,
} from './route'

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
 * statement may still commit later: it is then a lost claim (http/lost-claim.ts).
 */
const CLAIM_TIMEOUT_MS = 5_000
/** 10,000 answers of about 1 kB: 10 MB at most, enough for every key of a retry storm. */
const DEFAULT_REPLAY_CACHE_ENTRIES = 10_000
export { DEFAULT_MAX_BODY_BYTES, DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS }

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
  const completeRecovering = completer(route, pools, options.now)
  if (!route.record === !route.recordRows) throw new TypeError(`idempotentPost ${route.path}: give the route exactly one of record and recordRows`)
  // Merged once at start, so a route's code that means something else than the plugin's is refused here; a
  // failure of the route is answered from the route's own codes (failure.ts).
  if (route.problems) PLUGIN_PROBLEMS.with(route.problems)
  const event = { route: route.path }
  const cache = options.now ? undefined : new ReplayCache(options.replayCacheEntries ?? DEFAULT_REPLAY_CACHE_ENTRIES)
  // Keys this process runs now: their retries here are answered without a claim statement.
  const running = options.now ? undefined : new RunningKeys()
  // Keys the database just said another run has: a retry storm of one costs a claim statement every 250 ms, not each.
  const busy = options.now ? undefined : new BusyKeys()

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
    const busyFor = busy?.retryAfter(tenant, key, identity.fingerprint)
    if (busyFor !== undefined) {
      count('in_progress', started)
      return problemResponse({ ...problem('in-progress'), retryAfterSeconds: busyFor })
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
      recoverLostClaim(pools.short, { tenant, key, lease: leaseId }, claiming, () => notify('onRelease', hooks.onRelease, { ...event, reason: 'lost_claim' }))
      // Past the deadline, whichever timer fired first (ours, or the queue's abort), the database did not answer in time.
      return failure(fromEngine(claimDeadline.aborted && !isUnavailable(error) ? new DatabaseUnavailableError(error) : error), started, 'lost-claim', about)
    }
    switch (claimed.kind) {
      case 'replay':
        ticket?.end()
        cache?.set(tenant, key, seen, claimed.response, retentionSeconds, claimSentAt, claimed.ageSeconds)
        count('replayed', started)
        return replay(claimed.response)
      case 'in_progress':
        ticket?.end()
        busy?.note(tenant, key, identity.fingerprint, claimed.retryAfterSeconds)
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
      // The external phase: no connection held, no transaction open. What it throws is the route's failure, never the engine's.
      const result = await untilAborted(routeStep('act', () => route.act({
        body,
        tenant: lease.tenant,
        key: lease.key,
        request,
        signal: deadline.signal,
        idempotencyKey: downstreamKey(lease),
        attempt: lease.attempts,
      })), deadline.signal)
      // The completing phase: one statement (or one short transaction), fenced by the lease.
      const stored = await completeRecovering({
        lease, body, result, requestId: requestIdOf(request), recovery: recoveryUntil(claimSentAt + budgetMs),
        sending: () => {
          completing = true
          completionSentAt ??= performance.now()
        },
      })
      // The completion sets completed_at after completionSentAt: the entry ends before the key's retention, however late the commit's answer.
      cache?.set(lease.tenant, lease.key, seen, stored, retentionSeconds, completionSentAt!)
      count(outcome, started)
      return new Response(stored.body, { status: stored.status, headers: stored.headers })
    } catch (caught) {
      // The act's failure is the route's (routeStep); anything else here failed in the engine's phase: as the engine's error.
      const error = fromEngine(caught)
      if (error instanceof LeaseLostError) {
        notify('onLeaseLost', hooks.onLeaseLost, event)
        count('lease_lost', started)
        logOf(about).warn('lease lost: the key was reclaimed or force-expired while this request ran; its writes were rolled back', { outcome: 'lease_lost', attempt: lease.attempts })
        return problemResponse(problem('lease-lost'))
      }
      const reason = releaseReasonOf(error)
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

  /** Recovery of a statement of this route until `until` (performance.now()), counted by kind and cause. */
  function recoveryUntil(until: number): Recovery {
    return { until, onRetry: (statement: StatementKind, cause: RetryCause) => notify('onRetry', hooks.onRetry, { ...event, statement, cause }) }
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

  /** The answer and the line of a request that failed after its checks (http/failure.ts). */
  function failure(error: unknown, started: number, key: KeyState, about: About, lease?: Lease): Response {
    count('failed', started)
    reportFailure(logOf(about), error, key, lease, route.problems)
    return failureResponse(error, key, route.problems, ttlSeconds)
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

  return new Elysia({ name: 'idempotent-post', seed: route.path })
    .post(route.path, function idempotentHandler({ request }) { return handle(request) }, {
      parse: 'none',
      detail: detail(idempotentOperation(route.body, route.docs ?? {}, { ttlSeconds, retentionSeconds })),
    })
}

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

function replay(response: StoredResponse): Response {
  return new Response(response.body, {
    status: response.status,
    headers: { ...response.headers, 'idempotent-replayed': 'true' },
  })
}
