import type { StoredResponse } from '../core/types'

/**
 * Completed keys' answers, kept in this process for replays that need no
 * database at all.
 *
 * Safe because a completed key is immutable for its retention: nothing
 * changes a done row before it expires (operators force-expire only keys in
 * processing; the purge and a claim's renewal touch only keys past their
 * retention), in this process or any other. So an answer seen done, with its
 * fingerprint, stays the answer for that key until its retention ends, and an
 * entry is dropped a margin before that, counted on this process's clock from
 * the key's age as the database saw it (no clock skew enters).
 *
 * Why: a replay otherwise costs the claim statement, about 3.5 times the
 * naive design's single SELECT in the database (BENCHMARKS.md); retries of
 * finished requests are most of a retry storm's traffic.
 *
 * Bounded: least recently used entries go first (a Map keeps insertion order;
 * a hit moves its entry to the end).
 */
export interface CachedAnswer {
  readonly fingerprint: string
  readonly response: StoredResponse
  /** performance.now() after which the entry is not used. */
  readonly usableUntil: number
}

/** 10 s, or a tenth of a short retention: an entry never outlives its key's retention. */
export function replayMarginMs(retentionSeconds: number): number {
  return Math.min(10_000, retentionSeconds * 100)
}

export class ReplayCache {
  readonly #entries = new Map<string, CachedAnswer>()
  readonly #max: number

  constructor(maxEntries: number) {
    this.#max = maxEntries
  }

  get size(): number {
    return this.#entries.size
  }

  get(tenant: string, key: string): CachedAnswer | undefined {
    const id = `${tenant}\u0000${key}`
    const entry = this.#entries.get(id)
    if (!entry) return undefined
    this.#entries.delete(id)
    if (performance.now() >= entry.usableUntil) return undefined
    this.#entries.set(id, entry)
    return entry
  }

  /** Remembers a done key's answer; `ageSeconds` is how long ago it completed (0 for one completed just now). */
  set(tenant: string, key: string, fingerprint: string, response: StoredResponse, retentionSeconds: number, ageSeconds = 0): void {
    if (this.#max <= 0) return
    const left = (retentionSeconds - ageSeconds) * 1000 - replayMarginMs(retentionSeconds)
    if (left <= 0) return
    const id = `${tenant}\u0000${key}`
    this.#entries.delete(id)
    this.#entries.set(id, { fingerprint, response, usableUntil: performance.now() + left })
    while (this.#entries.size > this.#max) this.#entries.delete(this.#entries.keys().next().value!)
  }
}
