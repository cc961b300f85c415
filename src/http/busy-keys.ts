/**
 * Keys the database just said are in progress under another run (another
 * process's, most often): for BUSY_MEMORY_MS a retry of the same request is
 * answered 409 from memory, with the Retry-After the database's answer gave.
 *
 * Why: in a retry storm of one key that another process runs, every 409
 * otherwise costs a claim statement, queued behind the batch in flight; 32
 * clients retrying at once saw p99 20 ms (BENCHMARKS.md, "409s").
 *
 * What it may cost: a retry arriving within BUSY_MEMORY_MS after the run
 * ended (completed, released, or its key reclaimable) is told 409 with
 * Retry-After >= 1 s instead of its answer; its next retry, a second later,
 * asks the database. A 409 promises nothing but "later", so no answer is
 * wrong, only late by at most BUSY_MEMORY_MS for clients that ignore
 * Retry-After. Another request under the key (another fingerprint) is not
 * answered from here: the database says 422. Per process, per tenant.
 *
 * Bounded: MAX_ENTRIES, the oldest dropped first; an entry is used for
 * BUSY_MEMORY_MS at most.
 */
export const BUSY_MEMORY_MS = 250
const MAX_ENTRIES = 10_000

interface Busy {
  readonly fingerprint: string
  readonly retryAfterSeconds: number
  /** The clock's reading after which the entry is not used. */
  readonly until: number
}

export class BusyKeys {
  readonly #entries = new Map<string, Busy>()

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** The database answered `retryAfterSeconds` (a 409) to the request with this fingerprint. */
  note(tenant: string, key: string, fingerprint: string, retryAfterSeconds: number): void {
    const id = `${tenant}\u0000${key}`
    this.#entries.delete(id)
    this.#entries.set(id, { fingerprint, retryAfterSeconds, until: this.now() + BUSY_MEMORY_MS })
    if (this.#entries.size > MAX_ENTRIES) this.#entries.delete(this.#entries.keys().next().value!)
  }

  /** The Retry-After of a 409 for this request, if the database said so within BUSY_MEMORY_MS. */
  retryAfter(tenant: string, key: string, fingerprint: string): number | undefined {
    const id = `${tenant}\u0000${key}`
    const entry = this.#entries.get(id)
    if (!entry) return undefined
    if (this.now() >= entry.until) {
      this.#entries.delete(id)
      return undefined
    }
    return entry.fingerprint === fingerprint ? entry.retryAfterSeconds : undefined
  }
}
