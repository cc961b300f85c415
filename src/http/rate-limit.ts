/**
 * Per-tenant limits, in front of the payments API (and outside the engine):
 *
 * - a rate: a token bucket per tenant, `burst` deep, refilled at `rate` per
 *   second. Over it: 429 `rate-limited` with Retry-After (when the next token
 *   is there) and the IETF RateLimit fields (draft-ietf-httpapi-ratelimit-
 *   headers-09/10: `RateLimit-Policy: "tenant";q=<burst>;w=<seconds to refill
 *   it>` and `RateLimit: "tenant";r=<left>;t=<seconds>`) on every answer.
 * - a cap on requests in processing at once: over it, 429 `too-many-in-flight`
 *   with Retry-After: 1. A 429, not a 503: the service is fine, this tenant
 *   has sent more than its share at once (and the client helper, like any
 *   well-behaved client, retries a 429 after Retry-After).
 *
 * Both are O(1) per request: one map lookup, a little arithmetic, and a
 * counter the answer gives back. The maps are bounded by the tenants of
 * API_KEYS (fixed at start): a request without a valid key is never counted
 * here, it gets its 401 from the route.
 *
 * Per process, in memory, on purpose: a shared counter (the database, Redis)
 * would put a round trip in front of every request, 409s and replays
 * included, to limit what is mostly a guard against one tenant flooding one
 * process's pools. What that misses: with WORKERS=N or several instances, a
 * tenant gets up to N times the rate and the cap in total (the kernel spreads
 * connections, not tenants, over workers); set the limits per process with
 * that in mind, or enforce a global quota at the load balancer.
 */
import { EDGE_PROBLEMS } from './edge-problems'
import type { RefusalReason } from './tenant-refusals'
import { problem, problemResponse, type Problem } from './problem'

export interface TenantLimitOptions {
  /** Requests per second per tenant; 0: no rate limit. */
  readonly rate: number
  /** Bucket depth: requests a tenant may send at once after being idle. */
  readonly burst: number
  /** Requests per tenant in processing at once; 0: no cap. */
  readonly maxInFlight: number
  /** Milliseconds; tests move it. @default performance.now */
  readonly now?: () => number
}

export type Admission =
  | { readonly ok: true; readonly headers: Readonly<Record<string, string>>; release(): void }
  | { readonly ok: false; readonly response: Response; readonly reason: RefusalReason }

interface Bucket {
  tokens: number
  /** When `tokens` was last brought up to date (ms). */
  at: number
}

/** The policy's name in the RateLimit fields. */
const POLICY = '"tenant"'

export class TenantLimits {
  readonly #rate: number
  readonly #burst: number
  readonly #maxInFlight: number
  readonly #now: () => number
  readonly #buckets = new Map<string, Bucket>()
  readonly #inFlight = new Map<string, number>()
  readonly #policy: string

  constructor(options: TenantLimitOptions) {
    this.#rate = options.rate
    this.#burst = Math.max(1, options.burst)
    this.#maxInFlight = options.maxInFlight
    this.#now = options.now ?? (() => performance.now())
    this.#policy = `${POLICY};q=${this.#burst};w=${Math.max(1, Math.ceil(this.#burst / Math.max(this.#rate, Number.MIN_VALUE)))}`
  }

  get enabled(): boolean {
    return this.#rate > 0 || this.#maxInFlight > 0
  }

  /** Requests of `tenant` in processing now (for tests and metrics). */
  inFlight(tenant: string): number {
    return this.#inFlight.get(tenant) ?? 0
  }

  /**
   * Lets a request of `tenant` in, or answers it. An admitted request must
   * call `release()` exactly once, when its answer is ready (the edge does it
   * in a `finally`); a second call does nothing.
   */
  admit(tenant: string): Admission {
    const headers: Record<string, string> = {}
    if (this.#rate > 0) {
      const bucket = this.#refill(tenant)
      if (bucket.tokens < 1) {
        const wait = Math.max(1, Math.ceil((1 - bucket.tokens) / this.#rate))
        return refuse('rate_limited', EDGE_PROBLEMS.problem('rate-limited', `This API key may send ${this.#rate} requests per second (bursts of ${this.#burst}); retry after ${wait} s.`, {}), wait, {
          'ratelimit-policy': this.#policy,
          ratelimit: `${POLICY};r=0;t=${wait}`,
        })
      }
      bucket.tokens -= 1
      headers['ratelimit-policy'] = this.#policy
      headers.ratelimit = `${POLICY};r=${Math.floor(bucket.tokens)};t=${Math.ceil((this.#burst - bucket.tokens) / this.#rate)}`
    }
    if (this.#maxInFlight > 0) {
      const current = this.#inFlight.get(tenant) ?? 0
      if (current >= this.#maxInFlight) {
        // The token taken above is given back: a refused request costs the tenant nothing but the wait.
        // Its answer still says where the rate stands (SPEC: every /api answer carries the RateLimit fields).
        if (this.#rate > 0) {
          const bucket = this.#buckets.get(tenant)!
          bucket.tokens += 1
          headers.ratelimit = `${POLICY};r=${Math.floor(bucket.tokens)};t=${Math.ceil((this.#burst - bucket.tokens) / this.#rate)}`
        }
        return refuse('too_many_in_flight', EDGE_PROBLEMS.problem('too-many-in-flight', `This API key has ${current} requests in processing, the most this server takes at once; retry after 1 s.`), 1, headers)
      }
      this.#inFlight.set(tenant, current + 1)
    }
    let released = false
    return {
      ok: true,
      headers,
      release: () => {
        if (released || this.#maxInFlight === 0) return
        released = true
        const left = (this.#inFlight.get(tenant) ?? 1) - 1
        if (left <= 0) this.#inFlight.delete(tenant)
        else this.#inFlight.set(tenant, left)
      },
    }
  }

  #refill(tenant: string): Bucket {
    const now = this.#now()
    let bucket = this.#buckets.get(tenant)
    if (!bucket) {
      bucket = { tokens: this.#burst, at: now }
      this.#buckets.set(tenant, bucket)
      return bucket
    }
    bucket.tokens = Math.min(this.#burst, bucket.tokens + ((now - bucket.at) / 1000) * this.#rate)
    bucket.at = now
    return bucket
  }
}

function refuse(reason: RefusalReason, answer: Problem, retryAfterSeconds: number, headers: Record<string, string>): Admission {
  return { ok: false, reason, response: problemResponse({ ...answer, retryAfterSeconds }, headers) }
}
