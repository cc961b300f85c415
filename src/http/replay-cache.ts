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
 * the key's age as the database saw it (no clock skew enters), and from the
 * instant *before* the statement that saw it was sent: the database measured
 * that age (or set `completed_at`) no earlier, so however long the answer took
 * to come back (a lock wait, a commit waiting for its standby), the entry ends
 * before the key's retention does. Counted from when the answer arrived, a
 * commit delayed 0.9 s at a retention of 2 s let one instance replay an expired
 * answer, and refuse (422) the new request another instance had already bound
 * to the key (test/http/replay-cache.test.ts).
 *
 * Why: a replay otherwise costs the claim statement, about 3.5 times the
 * naive design's single SELECT in the database (BENCHMARKS.md); retries of
 * finished requests are most of a retry storm's traffic.
 *
 * Bounded: least recently used entries go first, nearly (a Map keeps
 * insertion order; a hit moves its entry to the end once it is in the older
 * half, so most hits are one lookup: moving on every hit was 3 % of a replay).
 */
export interface CachedAnswer {
  readonly fingerprint: string
  /** The request seen with that fingerprint, as sent (small bodies only): the same text is the same request, unparsed. */
  readonly sent?: SentRequest | undefined
  readonly response: StoredResponse
  /** performance.now() after which the entry is not used. */
  readonly usableUntil: number
}

/** A request as it came: its path and its body's text. */
export interface SentRequest {
  readonly path: string
  readonly text: string
}

/** What the cache is told of the request that found the key done. */
export interface SeenRequest {
  readonly fingerprint: string
  readonly sent?: SentRequest | undefined
}

/**
 * 1 KiB: a payment's body is about 100 characters. A larger body is matched
 * by its fingerprint only, so 10,000 entries never hold more than ~10 MB of
 * request text (a body may be up to MAX_BODY_BYTES).
 */
export const MAX_SENT_TEXT_CHARS = 1024

/** 10 s, or a tenth of a short retention: an entry never outlives its key's retention. */
export function replayMarginMs(retentionSeconds: number): number {
  return Math.min(10_000, retentionSeconds * 100)
}

/** An entry, and the count of entries set or moved before it (its place in the Map's order). */
interface Slot {
  readonly answer: CachedAnswer
  readonly stamp: number
}

export class ReplayCache {
  readonly #entries = new Map<string, Slot>()
  #stamps = 0
  readonly #max: number
  readonly #now: () => number

  /** `now` is the clock of `at` and of the expiry (tests move it). */
  constructor(maxEntries: number, now: () => number = () => performance.now()) {
    this.#max = maxEntries
    this.#now = now
  }

  get size(): number {
    return this.#entries.size
  }

  /**
   * The answer of a done key when `sent` is, to the byte, the request the
   * cache saw with it: a replay that needs no parse, no check and no
   * fingerprint (equal text parses to the equal value that passed them).
   */
  sameAs(tenant: string, key: string, sent: SentRequest): CachedAnswer | undefined {
    const entry = this.get(tenant, key)
    return entry?.sent !== undefined && entry.sent.text === sent.text && entry.sent.path === sent.path ? entry : undefined
  }

  get(tenant: string, key: string): CachedAnswer | undefined {
    const id = `${tenant}\u0000${key}`
    const slot = this.#entries.get(id)
    if (!slot) return undefined
    if (this.#now() >= slot.answer.usableUntil) {
      this.#entries.delete(id)
      return undefined
    }
    // In the older half of the order: to the end, so an entry in use is not the next to go.
    if (this.#stamps - slot.stamp > this.#max / 2) this.#put(id, slot.answer)
    return slot.answer
  }

  /**
   * Remembers a done key's answer. `sentAt` is this clock read before the
   * statement that saw the key done was sent; `ageSeconds` how long before
   * that statement the key had completed, as the database said (0 for the
   * completion itself: it sets `completed_at` after `sentAt`).
   */
  set(tenant: string, key: string, request: SeenRequest, response: StoredResponse, retentionSeconds: number, sentAt: number, ageSeconds = 0): void {
    if (this.#max <= 0) return
    const usableUntil = sentAt + (retentionSeconds - ageSeconds) * 1000 - replayMarginMs(retentionSeconds)
    if (usableUntil <= this.#now()) return
    const sent = request.sent && request.sent.text.length <= MAX_SENT_TEXT_CHARS ? request.sent : undefined
    this.#put(`${tenant}\u0000${key}`, { fingerprint: request.fingerprint, sent, response, usableUntil })
    while (this.#entries.size > this.#max) this.#entries.delete(this.#entries.keys().next().value!)
  }

  #put(id: string, answer: CachedAnswer): void {
    this.#entries.delete(id)
    this.#entries.set(id, { answer, stamp: this.#stamps++ })
  }
}
