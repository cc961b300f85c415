/**
 * The service's side of the payment provider: one charge call, made safe to
 * repeat by the Idempotency-Key the caller derives (Exactly once at the provider, docs/explanation/invariants.md).
 *
 * What is retried here, and what is not:
 * - A lost answer (no response, connection reset, a body cut off) is retried
 *   after a short jittered pause with the SAME key: the charge may have been made, and only the
 *   same key lets the provider hand back that charge instead of a second one.
 * - A 5xx is not retried: the provider said it charged nothing, so the
 *   service fails fast, releases its own key, and its client retries the
 *   whole request (which reaches here again with the same key).
 * - The caller's signal (the request's deadline: Bounded processing) ends everything,
 *   in flight or between attempts, and the promise rejects with its reason
 *   unwrapped, so the caller can tell a deadline from a provider failure.
 */
import pRetry, { AbortError } from 'p-retry'
import { IdempotencyError } from '../core/errors'
import { DeadlineExceededError, untilAborted } from '../core/deadline'
import { parseCharge, sameTerms, type Charge, type ChargeRequest } from './charge'

export type { Charge, ChargeRequest } from './charge'

export interface ChargeOptions {
  /** Ours, derived from (tenant, key, claim): the same on every re-execution of one request. */
  readonly idempotencyKey: string
  /** The request's deadline: aborting it abandons the call at once. */
  readonly signal: AbortSignal
}

export interface PaymentProvider {
  charge(request: ChargeRequest, options: ChargeOptions): Promise<Charge>
}

export interface ProviderClientOptions {
  /** Injectable for tests. @default globalThis.fetch */
  readonly fetch?: typeof fetch
  /** Requests sent at most for one charge, the first included. @default DEFAULT_MAX_ATTEMPTS */
  readonly maxAttempts?: number
  /** Told of every HTTP call to the provider (each attempt), with its outcome and duration: the dependency metrics. @default none */
  readonly observe?: (event: ProviderCallEvent) => void
  /** Called as each HTTP call begins; the function it returns, as it ends (the in-flight gauges). */
  readonly begin?: () => () => void
}

/**
 * One HTTP call's outcome: `ok` (the charge), `failed` (an answer that
 * refuses or that we cannot use: 5xx, 422, a redirect, a malformed charge),
 * `lost` (no answer: refused, reset, cut off), `deadline` (the request's
 * deadline stopped it), `aborted` (a draining server stopped it).
 */
export type ProviderCallOutcome = 'ok' | 'failed' | 'lost' | 'deadline' | 'aborted'

export interface ProviderCallEvent {
  readonly outcome: ProviderCallOutcome
  readonly seconds: number
}

/** The provider failed or refused: answered 502 by the service, its key released for a retry. */
export class ProviderError extends IdempotencyError {
  constructor(
    message: string,
    /** The provider's HTTP status, or undefined when no usable answer came back. */
    readonly providerStatus: number | undefined,
    code: 'PROVIDER_FAILED' | 'PROVIDER_KEY_CONFLICT' = 'PROVIDER_FAILED',
    options?: ErrorOptions,
  ) {
    super(code, 502, message, options)
    this.name = 'ProviderError'
  }
}

/**
 * 5: with the backoff below a lost answer is retried over about 0.75-1.5 s in
 * all, well inside the 30 s TTL; a provider that loses 5 answers in a row is
 * down, and the service's own client retries later anyway.
 */
export const DEFAULT_MAX_ATTEMPTS = 5
/**
 * 50 ms doubling, randomised 1-2x (p-retry's jitter): a reset connection is
 * usually a blip, so the first retry comes quickly; the jitter keeps many
 * workers that lost answers in the same instant from retrying in lockstep.
 */
const BACKOFF = Object.freeze({ minTimeout: 50, factor: 2, maxTimeout: 1_000, randomize: true })

/** A charge whose answer never arrived: the only failure worth repeating with the same key. */
class LostAnswer extends Error {
  constructor(cause: unknown) {
    super('the payment provider answer was lost', { cause })
    this.name = 'LostAnswer'
  }
}

export function providerClient(baseUrl: string, options: ProviderClientOptions = {}): PaymentProvider {
  const fetchFn = options.fetch ?? fetch
  const maxAttempts = options.maxAttempts ?? DEFAULT_MAX_ATTEMPTS
  if (!Number.isSafeInteger(maxAttempts) || maxAttempts < 1) throw new RangeError('maxAttempts must be a whole number >= 1')
  const endpoint = `${baseUrl.replace(/\/+$/, '')}/v1/charges`

  /** One attempt, timed for `observe`. */
  async function attempt(request: ChargeRequest, chargeOptions: ChargeOptions): Promise<Charge> {
    const started = performance.now()
    let end: (() => void) | undefined
    try {
      end = options.begin?.()
    } catch {
      // counting never changes a charge
    }
    let outcome: ProviderCallOutcome = 'failed'
    try {
      const charge = await call(request, chargeOptions)
      outcome = 'ok'
      return charge
    } catch (error) {
      if (chargeOptions.signal.aborted) outcome = chargeOptions.signal.reason instanceof DeadlineExceededError ? 'deadline' : 'aborted'
      else if (error instanceof LostAnswer) outcome = 'lost'
      throw error
    } finally {
      try {
        end?.()
      } catch {
        // counting never changes a charge
      }
      if (options.observe) {
        try {
          options.observe({ outcome, seconds: (performance.now() - started) / 1000 })
        } catch {
          // counting never changes a charge
        }
      }
    }
  }

  /** One HTTP call. Throws LostAnswer (retry) or AbortError(ProviderError) (stop). */
  async function call(request: ChargeRequest, { idempotencyKey, signal }: ChargeOptions): Promise<Charge> {
    let status: number
    let text: string
    try {
      const response = await fetchFn(endpoint, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
        body: JSON.stringify({ amount: request.amount, currency: request.currency, customer: request.customer }),
        signal,
        // A redirect is an answer (a ProviderError below), not a lost one to retry.
        redirect: 'manual',
      })
      status = response.status
      text = await response.text()
    } catch (error) {
      // An abort is the caller's deadline, not a lost answer: p-retry rethrows the signal's reason.
      if (signal.aborted) throw signal.reason
      throw new LostAnswer(error)
    }
    if (status === 422)
      throw new AbortError(new ProviderError('the payment provider refused: this idempotency key was used with other parameters', status, 'PROVIDER_KEY_CONFLICT'))
    if (status !== 200) throw new AbortError(new ProviderError(`the payment provider answered ${status}`, status))
    const charge = parseCharge(safeJson(text))
    // A 200 we cannot read as the charge we asked for is not a charge we may record.
    if (!charge || !sameTerms(charge, request))
      throw new AbortError(new ProviderError('the payment provider answered with something that is not the requested charge', status))
    return charge
  }

  return {
    async charge(request, chargeOptions) {
      const { signal } = chargeOptions
      try {
        return await untilAborted(
          pRetry(() => attempt(request, chargeOptions), { ...BACKOFF, retries: maxAttempts - 1, signal }),
          signal,
        )
      } catch (error) {
        if (signal.aborted) throw signal.reason
        if (error instanceof LostAnswer)
          throw new ProviderError(`the payment provider answer was lost ${maxAttempts} times`, undefined, 'PROVIDER_FAILED', { cause: error.cause })
        if (error instanceof ProviderError) throw error
        throw new ProviderError('the payment provider call failed', undefined, 'PROVIDER_FAILED', { cause: error })
      }
    },
  }
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}
