/**
 * Checking an admin token, for the sign-in form and the JSON API's Bearer
 * header: throttled per client address (throttle.ts), every failure logged
 * with the address, the operator named by the token (operators.ts).
 */
import { log as defaultLog, type Logger } from '../log'
import { requestMeta } from '../http/client'
import { requestIdOf } from '../http/request-id'
import { type Operators } from './operators'
import { SignInThrottle, WINDOW_MS } from '../http/throttle'

export type TokenCheck =
  | { readonly kind: 'ok'; readonly operator: string }
  | { readonly kind: 'missing' }
  | { readonly kind: 'wrong' }
  | { readonly kind: 'throttled'; readonly retryAfterSeconds: number }

export type Via = 'form' | 'bearer'

const BEARER = /^Bearer (\S{1,512})$/i

export class AdminAuth {
  /** One verdict per request: the API's guard and its error handler may both ask, a failure counts once. */
  readonly #bearers = new WeakMap<Request, TokenCheck>()

  constructor(
    readonly operators: Operators,
    readonly throttle: SignInThrottle = new SignInThrottle(),
    private readonly log: Logger = defaultLog,
  ) {}

  /**
   * `Authorization: Bearer <token>` of an /admin/api request. No header, or
   * one without the Bearer scheme (RFC 6750), is no guess: it is refused and
   * not counted.
   */
  bearer(request: Request): TokenCheck {
    const known = this.#bearers.get(request)
    if (known) return known
    const header = request.headers.get('authorization')?.trim()
    const token = header ? BEARER.exec(header)?.[1] : undefined
    const verdict = token === undefined ? { kind: 'missing' as const } : this.check(request, token, 'bearer')
    this.#bearers.set(request, verdict)
    return verdict
  }

  /**
   * A token presented by `request`: throttled addresses are refused without
   * looking at it (no oracle for a guesser); a wrong one is counted and logged.
   */
  check(request: Request, token: string, via: Via): TokenCheck {
    const { address } = requestMeta(request)
    const state = this.throttle.check(address)
    if (state.throttled) {
      if (this.throttle.firstRefusal(address))
        this.log.warn('admin sign-in throttled', { address, via, retry_after_seconds: state.retryAfterSeconds, request_id: requestIdOf(request) })
      return { kind: 'throttled', retryAfterSeconds: state.retryAfterSeconds }
    }
    const operator = this.operators.identify(token)
    if (operator === undefined) {
      const failures = this.throttle.fail(address)
      const now = this.throttle.check(address)
      this.log.warn('admin sign-in failed: wrong token', {
        address, via, failures_in_window: failures, window_seconds: WINDOW_MS / 1000, request_id: requestIdOf(request),
        ...(now.throttled ? { throttled_for_seconds: now.retryAfterSeconds } : {}),
      })
      return { kind: 'wrong' }
    }
    // A right token clears nothing (throttle.ts): the address's failures age out of the window.
    return { kind: 'ok', operator }
  }
}
