/**
 * One claimed request through the gateway: the plugin's phases
 * (http/idempotency.ts) for a body of any type and an upstream the gateway
 * does not know. Claim the key in one statement (replay, 409 + Retry-After,
 * 422 answered from the claim's row); forward with no connection held, under
 * the route's deadline and a derived Idempotency-Key; then store the
 * upstream's answer in one fenced statement and answer it. The same
 * in-process shortcuts as the plugin: finished keys replayed from memory
 * (ReplayCache), keys this process runs and keys the database just said are
 * busy answered 409 without a statement (RunningKeys, BusyKeys).
 *
 * What each upstream outcome does to the key (routes.ts):
 * - an answer: stored and replayed, but a 5xx (and a 4xx when the route says
 *   `on4xx: release`) is answered unstored and the key released, as is an
 *   answer over the route's stored-answer limit (counted);
 * - never sent (connection refused): released, 502;
 * - unknown (sent, no whole answer: reset, cut off, deadline, shutdown):
 *   `hold` leaves the key processing until its TTL (claimed with no owner,
 *   so no retry takes it over before: 409 with Retry-After), `release`
 *   gives it back (a retry forwards again, under the same derived key).
 */
import { claim, inProgress } from '../core/claim'
import { completeRows } from '../core/complete-rows'
import { completeRecovering } from '../core/completion-recovery'
import { DeadlineExceededError, deadlineSignal, executionBudgetMs, ShuttingDownError, withTimeout } from '../core/deadline'
import { downstreamKey } from '../core/downstream-key'
import { DatabaseUnavailableError, LeaseLostError } from '../core/errors'
import { newLeaseId } from '../core/lease-id'
import type { Recovery } from '../core/recovery'
import { release, type ReleaseReason } from '../core/release'
import type { ClaimResult, Lease, StoredResponse } from '../core/types'
import { BusyKeys } from '../http/busy-keys'
import { parseIdempotencyKey } from '../http/idempotency-key'
import type { InFlight } from '../http/in-flight'
import { recoverLostClaim } from '../http/lost-claim'
import { notify, type IdempotencyHooks, type Outcome } from '../http/outcomes'
import { problem, problemResponse, type Problem } from '../http/problem'
import { ReplayCache } from '../http/replay-cache'
import { requestIdOf, requestLogger } from '../http/request-id'
import type { IdempotencyPools } from '../http/route'
import { RunningKeys } from '../http/running-keys'
import { log as processLog, type Logger } from '../log'
import { hold } from '../core/hold'
import { gatewayFingerprint } from './fingerprint'
import { forward, send, type ForwardResult } from './forward'
import { responseHeadersForClient, type ForwardedFor } from './headers'
import { readBody } from './body'
import { replay, toStored } from './stored'
import type { GatewayMetrics } from './metrics'
import { routeFor, type GatewayRoute } from './routes'
import { GATEWAY_PROBLEMS as ALL_PROBLEMS } from './problems'
import { tenantOf } from './tenant'


/** As the plugin's (http/idempotency.ts): 5 s for a claim, queueing included, then 503. */
const CLAIM_TIMEOUT_MS = 5_000
/** As the plugin's: a release that the database cannot take in this time is left to the TTL. */
const RELEASE_TIMEOUT_MS = 2_000
/** As the plugin's: 10,000 answers; the gateway's stored answers may be up to the route's limit each. */
const DEFAULT_REPLAY_CACHE_ENTRIES = 10_000
/** The `path` column's bound (sql/engine/00001): the target is kept whole in the fingerprint, cut here. */
const MAX_PATH_CHARS = 2048

export interface ExchangeOptions {
  readonly pools: IdempotencyPools
  readonly routes: readonly GatewayRoute[]
  readonly defaultUpstream: string
  readonly retentionSeconds: number
  readonly tenantHeader: string
  readonly requireKey: boolean
  readonly unreplayedHeaders: ReadonlySet<string>
  readonly inFlight?: InFlight | undefined
  /** This process's heartbeat id: the owner of the keys of `release` routes (a `hold` route's keys have none). */
  readonly owner?: (() => string | undefined) | undefined
  readonly hooks?: IdempotencyHooks | undefined
  readonly metrics?: GatewayMetrics | undefined
  readonly log?: Logger | undefined
  /** 0 turns the in-process replay cache off. @default 10000 */
  readonly replayCacheEntries?: number | undefined
}

/** Where a request came from, for `Forwarded`. */
export type Client = ForwardedFor

/** The gateway's request handler: claimed requests through the phases above, the rest forwarded untouched. */
export function gatewayExchange(options: ExchangeOptions): (request: Request, client: Client) => Promise<Response> {
  const { pools, hooks = {} } = options
  const log = options.log ?? processLog
  const cache = new ReplayCache(options.replayCacheEntries ?? DEFAULT_REPLAY_CACHE_ENTRIES)
  const running = new RunningKeys()
  const busy = new BusyKeys()

  return async function exchange(request, client) {
    const url = new URL(request.url)
    const target = `${url.pathname}${url.search}`
    const method = request.method.toUpperCase()
    const route = routeFor(options.routes, method, url.pathname)
    if (!route) return passThrough(request, options.defaultUpstream, target, client)
    const rawKey = request.headers.get('idempotency-key')
    if (rawKey === null && !options.requireKey) return passThrough(request, route.upstream, target, client)
    return claimed(request, route, target, method, rawKey, client)
  }

  function count(route: GatewayRoute, outcome: Outcome, started: number): void {
    notify('onOutcome', hooks.onOutcome, { route: route.name, outcome, seconds: (performance.now() - started) / 1000 })
  }

  async function claimed(request: Request, route: GatewayRoute, target: string, method: string, rawKey: string | null, client: Client): Promise<Response> {
    const started = performance.now()
    const refuse = (answer: Problem, outcome: Outcome = 'invalid') => {
      count(route, outcome, started)
      return problemResponse(answer)
    }
    const field = parseIdempotencyKey(rawKey)
    if (!field.ok) return refuse(problem(field.reason === 'missing' ? 'missing-idempotency-key' : 'invalid-idempotency-key'))
    const { key } = field
    const body = await readBody(request, route.maxBodyBytes)
    if (body === 'too_large') return refuse(problem('body-too-large', `The body must be at most ${route.maxBodyBytes} bytes.`))
    if (body === 'aborted') return refuse(problem('invalid-request', 'The connection closed before the body was read.'))
    const tenant = tenantOf(request, options.tenantHeader)
    const fingerprint = gatewayFingerprint(method, target, request.headers.get('content-type'), body)
    const seen = { fingerprint }

    const cached = cache.get(tenant, key)
    if (cached) {
      if (cached.fingerprint !== fingerprint) return refuse(problem('idempotency-key-reused'), 'mismatch')
      count(route, 'replayed', started)
      return replay(cached.response)
    }
    if (options.inFlight?.draining)
      return refuse(problem('shutting-down', 'This gateway is stopping; nothing was forwarded. Retry with the same Idempotency-Key.'), 'failed')
    const mine = running.get(tenant, key)
    if (mine) {
      if (mine.fingerprint !== fingerprint) return refuse(problem('idempotency-key-reused'), 'mismatch')
      const ageSeconds = (performance.now() - mine.since) / 1000
      return refuse({ ...problem('in-progress'), retryAfterSeconds: inProgress(route.ttlSeconds - ageSeconds, ageSeconds).retryAfterSeconds }, 'in_progress')
    }
    const busyFor = busy.retryAfter(tenant, key, fingerprint)
    if (busyFor !== undefined) return refuse({ ...problem('in-progress'), retryAfterSeconds: busyFor }, 'in_progress')

    const leaseId = newLeaseId()
    const ticket = options.inFlight?.claiming(leaseId)
    const claimDeadline = AbortSignal.timeout(CLAIM_TIMEOUT_MS)
    const claimSentAt = performance.now()
    const identity = { tenant, key, method, path: target.slice(0, MAX_PATH_CHARS), fingerprint }
    const claiming = claim(pools.short, identity, {
      ttlSeconds: route.ttlSeconds,
      retentionSeconds: options.retentionSeconds,
      // A held key must look worked on until its TTL, whatever becomes of this process: no owner (core/policy.ts workedOn).
      owner: route.unknown === 'hold' ? null : options.owner?.(),
      lease: leaseId,
      summary: { gateway_route: route.name, upstream: new URL(route.upstream).host },
      httpRequestId: requestIdOf(request),
    }, { signal: claimDeadline, recovery: recoveryUntil(route, claimSentAt + CLAIM_TIMEOUT_MS) })
    let result: ClaimResult
    try {
      result = await withTimeout(claiming, CLAIM_TIMEOUT_MS, () => new DatabaseUnavailableError(new Error(`the claim got no answer within ${CLAIM_TIMEOUT_MS} ms`)))
    } catch (error) {
      ticket?.end()
      recoverLostClaim(pools.short, { tenant, key, lease: leaseId }, claiming, () => notify('onRelease', hooks.onRelease, { route: route.name, reason: 'lost_claim' }))
      requestLogger(request, { tenant, route: route.name, key }, log).error('claim failed', { error })
      return refuse(problem('database-unavailable'), 'failed')
    }
    switch (result.kind) {
      case 'replay':
        ticket?.end()
        cache.set(tenant, key, seen, result.response, options.retentionSeconds, claimSentAt, result.ageSeconds)
        count(route, 'replayed', started)
        return replay(result.response)
      case 'in_progress':
        ticket?.end()
        busy.note(tenant, key, fingerprint, result.retryAfterSeconds)
        return refuse({ ...problem('in-progress'), retryAfterSeconds: result.retryAfterSeconds }, 'in_progress')
      case 'mismatch':
        ticket?.end()
        return refuse(problem('idempotency-key-reused'), 'mismatch')
      case 'created':
      case 'reclaimed': {
        if (result.kind === 'reclaimed') notify('onReclaim', hooks.onReclaim, { route: route.name })
        const leave = running.enter(tenant, key, fingerprint, budgetMs(route), claimSentAt)
        try {
          return await run(request, route, target, method, body, client, seen, result.lease, result.kind, claimSentAt, started, ticket)
        } finally {
          leave()
          ticket?.end()
        }
      }
    }
  }

  async function run(request: Request, route: GatewayRoute, target: string, method: string, body: Uint8Array<ArrayBuffer>, client: Client, seen: { fingerprint: string },
    lease: Lease, outcome: 'created' | 'reclaimed', claimSentAt: number, started: number, ticket: ReturnType<InFlight['claiming']> | undefined): Promise<Response> {
    const deadline = deadlineSignal(budgetMs(route), claimSentAt)
    ticket?.hold(lease, deadline.abort)
    const logger = requestLogger(request, { tenant: lease.tenant, route: route.name, key: lease.key }, log)
    let forwarded: ForwardResult
    try {
      forwarded = await forward({
        upstream: route.upstream, method, target, headers: request.headers, body, forwarded: client,
        idempotencyKey: downstreamKey(lease), signal: deadline.signal,
      }, route.maxStoredBytes)
    } finally {
      deadline.clear()
    }
    const reason: ReleaseReason = deadline.signal.reason instanceof ShuttingDownError ? 'shutdown' : deadline.signal.reason instanceof DeadlineExceededError ? 'deadline' : 'failed'
    options.metrics?.upstream.observe({ route: route.name, outcome: forwarded.kind === 'unknown' && reason === 'deadline' ? 'deadline' : forwarded.kind === 'too_large' ? 'answered' : forwarded.kind }, forwarded.seconds)

    if (forwarded.kind === 'not_sent') {
      await giveBack(route, lease, 'failed')
      logger.warn('upstream refused the connection: nothing sent, key released', { error: forwarded.error, outcome: 'failed' })
      count(route, 'failed', started)
      return problemResponse(ALL_PROBLEMS.problem('upstream-unreachable'))
    }
    if (forwarded.kind === 'unknown') {
      const timedOut = reason === 'deadline'
      if (route.unknown === 'release') {
        await giveBack(route, lease, reason)
        logger.warn('upstream outcome unknown: key released (route rule release)', { error: forwarded.error, reason, outcome: 'failed' })
        count(route, 'failed', started)
        const detail = `${timedOut ? 'The upstream did not answer in time' : 'The upstream\'s answer was lost'}; the key was released: a retry forwards the request again, under the same upstream Idempotency-Key.`
        return problemResponse({ ...ALL_PROBLEMS.problem(timedOut ? 'upstream-timeout' : 'upstream-outcome-unknown', detail), retryAfterSeconds: 1 })
      }
      if (reason === 'deadline') notify('onDeadline', hooks.onDeadline, { route: route.name })
      await keep(route, lease, timedOut ? 'the upstream did not answer before the deadline' : 'the upstream\'s answer was lost')
      const heldSeconds = Math.max(1, Math.ceil((claimSentAt + route.ttlSeconds * 1000 - performance.now()) / 1000))
      logger.warn('upstream outcome unknown: key held in processing until its TTL (route rule hold)', { error: forwarded.error, reason, outcome: 'failed', held_seconds: heldSeconds })
      count(route, 'failed', started)
      const detail = `${timedOut ? 'The upstream did not answer in time' : 'The upstream\'s answer was lost'}, so whether it acted is unknown. The key is held: a retry gets 409 for up to ${heldSeconds} s (its TTL), ` +
        'unless an operator releases it; then it is forwarded again under the same upstream Idempotency-Key.'
      return problemResponse({ ...ALL_PROBLEMS.problem(timedOut ? 'upstream-timeout' : 'upstream-outcome-unknown', detail), retryAfterSeconds: heldSeconds })
    }
    if (forwarded.kind === 'too_large') {
      await giveBack(route, lease, 'failed')
      options.metrics?.unstored.inc({ route: route.name, reason: 'too_large' })
      logger.warn('upstream answer over the stored-answer limit: answered, not stored, key released', { limit_bytes: route.maxStoredBytes, status: forwarded.status })
      count(route, outcome, started)
      return new Response(forwarded.body, { status: forwarded.status, headers: forwarded.headers })
    }

    const { status, headers, body: answer } = forwarded
    const rule = status >= 500 ? route.on5xx : status >= 400 ? route.on4xx : 'store'
    if (rule === 'release') {
      await giveBack(route, lease, 'failed')
      options.metrics?.unstored.inc({ route: route.name, reason: status >= 500 ? 'status_5xx' : 'status_4xx' })
      count(route, 'failed', started)
      return new Response(answer, { status, headers })
    }
    const stored = toStored(status, headers, answer, options.unreplayedHeaders)
    try {
      const done = await completeStored(route, lease, stored, claimSentAt)
      // performance.now() before the completion was sent would be exact; the claim's instant is earlier still, so safe.
      cache.set(lease.tenant, lease.key, seen, done, options.retentionSeconds, claimSentAt)
      count(route, outcome, started)
      return new Response(answer, { status, headers })
    } catch (error) {
      if (error instanceof LeaseLostError) {
        notify('onLeaseLost', hooks.onLeaseLost, { route: route.name })
        count(route, 'lease_lost', started)
        logger.warn('lease lost: the key was reclaimed or force-expired while the upstream answered; that answer is not stored', { outcome: 'lease_lost' })
        return problemResponse(problem('lease-lost'))
      }
      // The upstream acted and its answer could not be stored: the client gets it; the key follows the unknown-outcome rule.
      options.metrics?.unstored.inc({ route: route.name, reason: 'completion_failed' })
      if (route.unknown === 'release') await giveBack(route, lease, 'failed')
      else await keep(route, lease, 'the upstream answered, and its answer could not be stored')
      logger.error(`the upstream's answer could not be stored: answered, key ${route.unknown === 'release' ? 'released' : 'held'}`, { error, outcome: 'failed' })
      count(route, 'failed', started)
      return new Response(answer, { status, headers })
    }
  }

  /** The completion, sent again while the route's deadline leaves time (core/completion-recovery.ts). */
  function completeStored(route: GatewayRoute, lease: Lease, stored: StoredResponse, claimSentAt: number): Promise<StoredResponse> {
    return completeRecovering(pools.short, lease, (alone) => completeRows(pools.short, lease, stored, {}, { alone }), recoveryUntil(route, claimSentAt + budgetMs(route)))
  }

  function recoveryUntil(route: GatewayRoute, until: number): Recovery {
    return { until, onRetry: (statement, cause) => notify('onRetry', hooks.onRetry, { route: route.name, statement, cause }) }
  }

  /**
   * The hold rule: the key stays in processing (a retry gets 409 until its TTL), marked held with `why`, so
   * an operator may release it sooner (core/hold.ts). Unmarked, it is still held until the TTL.
   */
  async function keep(route: GatewayRoute, lease: Lease, why: string): Promise<void> {
    options.metrics?.held.inc({ route: route.name })
    try {
      await withTimeout(hold(pools.short, lease, why), RELEASE_TIMEOUT_MS, () => new Error('marking the key held timed out'))
    } catch (error) {
      log.warn('could not mark the key held: it is held until its TTL all the same, and an operator cannot release it sooner', { error, route: route.name })
    }
  }

  async function giveBack(route: GatewayRoute, lease: Lease, reason: ReleaseReason): Promise<void> {
    try {
      const released = await withTimeout(release(pools.short, lease, reason), RELEASE_TIMEOUT_MS, () => new Error('release timed out'))
      if (released) notify('onRelease', hooks.onRelease, { route: route.name, reason })
    } catch (error) {
      log.warn('release failed: the key becomes reclaimable after its TTL', { error, route: route.name })
    }
  }
}

/** The longest one forward may take: the route's timeout, within the TTL less its margin (the key cannot be reclaimed before). */
function budgetMs(route: GatewayRoute): number {
  const budget = executionBudgetMs(route.ttlSeconds)
  return route.timeoutMs === undefined ? budget : Math.min(route.timeoutMs, budget)
}

/** A request forwarded as it came: no claim, its body streamed. */
async function passThrough(request: Request, upstream: string, target: string, client: Client): Promise<Response> {
  const hasBody = request.method !== 'GET' && request.method !== 'HEAD' && request.body !== null
  try {
    const response = await send({ upstream, method: request.method, target, headers: request.headers, body: hasBody ? request.body : null, forwarded: client })
    return new Response(response.body, { status: response.status, statusText: response.statusText, headers: responseHeadersForClient(response.headers) })
  } catch {
    return problemResponse({ ...ALL_PROBLEMS.problem('upstream-unreachable', 'The upstream could not be reached, or its answer was lost.'), retryAfterSeconds: 1 })
  }
}
