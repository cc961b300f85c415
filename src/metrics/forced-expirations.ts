import type { AuditRange, AuditTallyRead } from './read-forced-expirations'

/** The outcomes of a forced expiration (core/force-expire.ts); each always has a series once counted. */
export const FORCED_EXPIRATION_OUTCOMES = ['expired', 'worker_alive', 'unchanged'] as const

/**
 * 50k ids per read while catching up after a start: a primary-key range scan
 * of that many audit rows stays far inside the 1 s statement timeout even on
 * a cold cache (100k rows took 0.4 s cold here, on 2 busy cores), and a trail
 * below that size (most) is counted by the very first scrape.
 */
export const FORCED_EXPIRATIONS_CHUNK = 50_000n

/**
 * idempotency_forced_expirations_total, derived from the audit trail, so it
 * counts the CLI, the JSON API and other replicas, not only this process'
 * page. The trail is append-only, so the count only grows: a counter.
 *
 * It is counted incrementally, not re-counted: ids up to `counted` are summed
 * once into `settled`, and each read covers only the ids above (the "tail").
 * The catch is that identity values are taken at INSERT time but become
 * visible at COMMIT: id 10 may commit after id 11 was seen, and a watermark
 * moved to 11 would skip 10 forever. So a range is settled only when no
 * transaction can still commit a row inside it:
 *  1. read n sees the highest visible id C (the candidate): every id ≤ C was
 *     already taken then (identity values only grow: CACHE 1, the default),
 *     by a transaction that took the table's write lock first;
 *  2. read n+1 notes which transactions hold that lock (before its counts):
 *     any that took an id ≤ C and has not ended is among them;
 *  3. once a later read finds none of them left, they have all committed or
 *     rolled back, so the read after it (a later snapshot) sees every row
 *     ≤ C that will ever exist, and `settled` absorbs them.
 * Until then those rows are read again each time as the tail, so nothing is
 * counted twice or missed. Only writers of this table hold it up: a long
 * transaction elsewhere does not. In steady state the tail is the ids
 * written in the last few scrapes: microseconds.
 *
 * After a start the trail is read in chunks of FORCED_EXPIRATIONS_CHUNK ids,
 * and the series stays absent until every visible row is counted: a counter
 * that climbed chunk by chunk would read as forced expirations to rate().
 * If the trail is emptied or recreated (ids restart), the count restarts,
 * which Prometheus reads as a counter reset.
 */
export class ForcedExpirationTally {
  /** Ids ≤ counted are summed in `settled`. */
  private counted = 0n
  /** Ids ≤ horizon are final: no transaction can still commit one. */
  private horizon = 0n
  /** 1: seen; 2: `writers` noted; 3: `ready`, they all ended: settle at the next read. */
  private candidate: { id: bigint; writers?: ReadonlySet<string>; ready: boolean } | undefined
  private readonly settled = new Map<string, number>()
  private readonly chunk: bigint

  constructor(options: { readonly chunk?: bigint } = {}) {
    this.chunk = options.chunk ?? FORCED_EXPIRATIONS_CHUNK
  }

  /** What the next read must cover. */
  range(): AuditRange {
    const lo = this.counted
    const horizon = this.horizon > lo ? this.horizon : lo
    return { lo, hi: lo + this.chunk, horizon, candidate: this.candidate?.id ?? horizon }
  }

  /** Folds in a read of `range()`. Returns the totals by outcome, or undefined while still catching up. */
  apply(range: AuditRange, read: AuditTallyRead): ReadonlyMap<string, number> | undefined {
    if (read.top < range.lo) {
      this.reset()
      return undefined
    }
    // 3. its writers were all gone before this read's counts: the candidate's range is final.
    let final = range.horizon
    if (this.candidate?.ready && this.candidate.id === range.candidate) {
      final = range.candidate
      this.candidate = undefined
    }
    if (final > this.horizon) this.horizon = final
    const tail = new Map<string, number>()
    for (const row of read.rows) {
      const outcome = (FORCED_EXPIRATION_OUTCOMES as readonly string[]).includes(row.outcome) ? row.outcome : 'other'
      const isFinal = row.segment === 0 || (row.segment === 1 && final === range.candidate)
      add(isFinal ? this.settled : tail, outcome, row.n)
    }
    const reached = final < range.hi ? final : range.hi
    if (reached > this.counted) this.counted = reached
    // 2. the candidate's possible writers, then whether they are gone (this read's lock list predates its counts only).
    if (this.candidate && !this.candidate.ready) {
      const now = new Set(read.writers)
      if (!this.candidate.writers) this.candidate.writers = now
      this.candidate.ready = ![...this.candidate.writers].some((writer) => now.has(writer))
    }
    // 1. a new candidate: the highest id this read's counts saw.
    if (!this.candidate && read.top > this.horizon) this.candidate = { id: read.top, ready: false }

    if (read.top > range.hi) return undefined
    const totals = new Map<string, number>(FORCED_EXPIRATION_OUTCOMES.map((outcome) => [outcome, 0]))
    for (const part of [this.settled, tail]) for (const [outcome, n] of part) add(totals, outcome, n)
    return totals
  }

  private reset(): void {
    this.counted = 0n
    this.horizon = 0n
    this.candidate = undefined
    this.settled.clear()
  }
}

function add(into: Map<string, number>, outcome: string, n: number): void {
  into.set(outcome, (into.get(outcome) ?? 0) + n)
}
