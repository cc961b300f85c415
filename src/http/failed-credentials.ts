/**
 * Wrong API keys and metrics tokens, seen: counted (http_auth_failures_total
 * by area), throttled per client address as the admin sign-in is
 * (http/throttle.ts: after 10 failures in a minute the address gets 429
 * with Retry-After, its credential not even looked at, so a guesser learns
 * nothing), and logged as a summary: one line at an address's first failure
 * in a window and one when it is throttled, never a line per guess (120,000
 * wrong keys from one address in 10 s were silent before; one line each
 * would flood the log instead).
 *
 * Only a presented credential counts: a request without Authorization
 * guesses nothing. A right one does not clear an address's failures (others
 * behind the same address may be the ones guessing): they age out.
 */
import type { Counter } from 'prom-client'
import { MAX_FAILURES, SignInThrottle, WINDOW_MS } from './throttle'
import { log as processLog, type Logger } from '../log'
import { requestMeta } from './client'
import { EDGE_PROBLEMS } from './edge-problems'
import { problemResponse } from './problem'
import { requestIdOf } from './request-id'

export type CredentialArea = 'api' | 'metrics'
export const CREDENTIAL_AREAS: readonly CredentialArea[] = ['api', 'metrics']

export class FailedCredentials {
  readonly #throttles: Map<CredentialArea, SignInThrottle>
  /** The IETF RateLimit fields of this throttle (as rate-limit.ts writes the tenant's): a 429 on /api says which limit it is. */
  readonly #policy: string

  /** `perMinute`: failures from one address within a minute before it is throttled (AUTH_FAILURES_PER_MINUTE); 0 counts and logs but never throttles. */
  constructor(
    private readonly counter: Counter<'area'> | undefined,
    private readonly log: Logger = processLog,
    perMinute = MAX_FAILURES,
    now: () => number = Date.now,
  ) {
    this.#throttles = new Map(CREDENTIAL_AREAS.map((area) => [area, new SignInThrottle(now, undefined, perMinute)]))
    this.#policy = `"credentials";q=${perMinute};w=${WINDOW_MS / 1000}`
  }

  /** The answer for an address throttled in `area`, before its credential is looked at; undefined to go on. */
  refusal(request: Request, area: CredentialArea): Response | undefined {
    const throttle = this.#throttles.get(area)!
    // No failure remembered from anyone: nothing to look up (the address is found only when asked for, http/client.ts).
    if (throttle.size === 0) return undefined
    const { address } = requestMeta(request)
    const state = throttle.check(address)
    if (!state.throttled) return undefined
    if (throttle.firstRefusal(address))
      this.log.warn(`${area === 'api' ? 'API key' : 'metrics token'} attempts throttled`, { area, address, retry_after_seconds: state.retryAfterSeconds, request_id: requestIdOf(request) })
    return problemResponse({ ...EDGE_PROBLEMS.problem('credentials-throttled'), retryAfterSeconds: state.retryAfterSeconds },
      { 'ratelimit-policy': this.#policy, ratelimit: `"credentials";r=0;t=${state.retryAfterSeconds}` })
  }

  /** A credential `request` presented in `area` was wrong. */
  failed(request: Request, area: CredentialArea): void {
    const { address } = requestMeta(request)
    this.counter?.inc({ area })
    const failures = this.#throttles.get(area)!.fail(address)
    if (failures === 1)
      this.log.warn(`wrong ${area === 'api' ? 'API key' : 'metrics token'}`, { area, address, request_id: requestIdOf(request), note: `further failures from this address in the next ${WINDOW_MS / 1000} s are counted, not logged` })
  }
}
