/**
 * Admin sign-in throttling, per client address, for the sign-in form and the
 * JSON API's Bearer token alike: after MAX_FAILURES wrong tokens within
 * WINDOW_MS, that address is answered 429 (with Retry-After) without its
 * token being looked at, until the oldest of those failures is a window old.
 * Then the right token works again: there is no lock-out beyond the window.
 *
 * Exact over any window (not a fixed minute, which would let 2 × 10 through
 * across a minute boundary): each address keeps the times of its last
 * MAX_FAILURES failures, and is throttled while the oldest of them is less
 * than a window old. A success forgets nothing: failures only age out
 * (issue 41: with a reset, 9 wrong tokens then the right one, over and over,
 * were 27 guesses a minute and never a 429; whoever holds one token may be
 * guessing another operator's). The API-key and metrics-token throttle
 * (failed-credentials.ts) is this class too, with the same rule.
 *
 * Memory is bounded: at most MAX_ADDRESSES addresses are remembered, the
 * least recently failed going first when a new one comes (an attacker
 * rotating addresses costs us 10,000 small entries, ~1 MB, never more).
 * IPv6 addresses are counted by their /64, which one host usually has all
 * of: otherwise a single machine would get 2^64 fresh addresses.
 *
 * Per process: with WORKERS=N (or several instances) an address gets up to
 * N × 10 tries a minute. Tokens are 32+ random characters in production, so
 * this is defence in depth against guessing, not the only wall.
 */
import { isIP } from 'node:net'

/** SPEC: at most 10 failures in a minute. */
export const MAX_FAILURES = 10
export const WINDOW_MS = 60_000
/** Enough for every address that failed in the last minute in any realistic attack on one process. */
export const MAX_ADDRESSES = 10_000

export type ThrottleState = { readonly throttled: false } | { readonly throttled: true; readonly retryAfterSeconds: number }

interface Entry {
  /** Failure times, oldest first, at most MAX_FAILURES. */
  readonly failures: number[]
  /** Whether the current block has been logged (one line per block, not one per refused attempt). */
  blockLogged: boolean
}

export class SignInThrottle {
  readonly #entries = new Map<string, Entry>()

  constructor(private readonly now: () => number = Date.now, private readonly maxAddresses = MAX_ADDRESSES, private readonly maxFailures = MAX_FAILURES) {}

  /** Whether `address` may try a token now. */
  check(address: string): ThrottleState {
    const entry = this.#entries.get(keyOf(address))
    if (this.maxFailures === 0 || !entry || entry.failures.length < this.maxFailures) return { throttled: false }
    const wait = entry.failures[0]! + WINDOW_MS - this.now()
    return wait > 0 ? { throttled: true, retryAfterSeconds: Math.ceil(wait / 1000) } : { throttled: false }
  }

  /** Records a wrong token; returns how many failures the address has in the window, this one included. */
  fail(address: string): number {
    const key = keyOf(address)
    const now = this.now()
    const entry = this.#entries.get(key) ?? { failures: [], blockLogged: false }
    // Re-inserted, so the Map's order is least recently failed first: the eviction order.
    this.#entries.delete(key)
    while (entry.failures.length > 0 && entry.failures[0]! <= now - WINDOW_MS) entry.failures.shift()
    entry.failures.push(now)
    if (entry.failures.length > Math.max(1, this.maxFailures)) entry.failures.shift()
    entry.blockLogged = false
    this.#entries.set(key, entry)
    if (this.#entries.size > this.maxAddresses) this.#entries.delete(this.#entries.keys().next().value!)
    return entry.failures.length
  }

  /** True the first time a throttled address is refused in its current block (log that one). */
  firstRefusal(address: string): boolean {
    const entry = this.#entries.get(keyOf(address))
    if (!entry || entry.blockLogged) return false
    entry.blockLogged = true
    return true
  }

  get size(): number {
    return this.#entries.size
  }
}

/** IPv4 as is; IPv6 by its /64 (the first four groups of the expanded address). */
export function keyOf(address: string): string {
  if (isIP(address) !== 6) return address
  const [head = '', tail = ''] = address.split('::') as [string, string?]
  const left = head ? head.split(':') : []
  const right = address.includes('::') ? (tail ? tail.split(':') : []) : []
  const groups = address.includes('::') ? [...left, ...Array(8 - left.length - right.length).fill('0'), ...right] : left
  return `${groups.slice(0, 4).map((group) => group.replace(/^0+(?=.)/, '')).join(':')}::/64`
}
