/**
 * The keys this process is running right now, with their first request's
 * fingerprint: a retry that lands on the process running its key is answered
 * 409 (or 422 for another request) from memory, with no claim statement.
 *
 * Exact while the run is younger than its deadline (TTL minus a tenth): until
 * then the key is `processing` under this run's lease in the database, as no
 * retry can reclaim it before the TTL and an operator cannot force-expire it
 * while our heartbeat lists the lease. Past the deadline the entry is not
 * used, and the database answers, as it does for retries landing on other
 * processes. (A process frozen until its heartbeat went stale may have been
 * force-expired: once it runs again, its own retries get 409 until the run
 * ends, never a second run here, while other processes may run it again.)
 *
 * Why: under a retry storm of one in-flight key, every 409 otherwise costs a
 * claim statement, queued behind the batch in flight (BENCHMARKS.md, "409s").
 *
 * Bounded by the requests in flight: an entry lives only while its run does.
 */
export interface RunningKey {
  readonly fingerprint: string
  /** performance.now() before the claim that began the run was sent. */
  readonly since: number
  /** performance.now() after which the entry is not used: the run's deadline. */
  readonly usableUntil: number
}

export class RunningKeys {
  readonly #entries = new Map<string, RunningKey>()

  get size(): number {
    return this.#entries.size
  }

  /**
   * Marks the key as run by this process until the returned function is
   * called. `since` is performance.now() read before the claim was sent: the
   * key's TTL runs from the claim statement, no earlier, so the entry ends
   * before the database would let another process reclaim it.
   */
  enter(tenant: string, key: string, fingerprint: string, budgetMs: number, since: number): () => void {
    const id = `${tenant}\u0000${key}`
    const entry: RunningKey = { fingerprint, since, usableUntil: since + budgetMs }
    this.#entries.set(id, entry)
    return () => {
      if (this.#entries.get(id) === entry) this.#entries.delete(id)
    }
  }

  get(tenant: string, key: string): RunningKey | undefined {
    const entry = this.#entries.get(`${tenant}\u0000${key}`)
    return entry && performance.now() < entry.usableUntil ? entry : undefined
  }
}
