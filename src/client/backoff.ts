/**
 * Retry timing for the client helper: exponential backoff with full jitter,
 * and the server's Retry-After.
 *
 * Full jitter (a uniform draw from 0 to the exponential cap) rather than
 * "equal" or no jitter: when hundreds of mobile clients lose the same answer
 * at once, un-jittered retries arrive again as one storm; full jitter spreads
 * them over the whole window and, in AWS's published comparison, does the
 * least total work of the common schemes.
 */

/** The delay before retry number `retry` (0 for the first retry): uniform in [0, min(cap, base * 2^retry)). */
export function fullJitter(retry: number, baseMs: number, capMs: number, random: () => number): number {
  // 2^retry overflows to Infinity long before it matters; min() keeps the cap.
  const ceiling = Math.min(capMs, baseMs * 2 ** retry)
  return Math.floor(random() * ceiling)
}

/**
 * Milliseconds a Retry-After header asks to wait, or undefined when it is
 * absent or unreadable. RFC 9110 allows delay-seconds or an HTTP-date; a date
 * in the past means "now" (0).
 */
export function retryAfterMs(header: string | null, nowMs: number): number | undefined {
  if (header === null) return undefined
  const value = header.trim()
  if (/^\d{1,10}$/.test(value)) return Number(value) * 1000
  // Only the date forms have letters and a comma or spaces; a bare "-5" or "1.5" is invalid.
  if (!/[A-Za-z]/.test(value)) return undefined
  const at = Date.parse(value)
  return Number.isNaN(at) ? undefined : Math.max(0, at - nowMs)
}
