/**
 * When /metrics was last read, so that a drain can wait for one more read
 * after its last answer. Without it the last requests' counters (the 504s of
 * the drain, every `shutdown` release) were written into a registry nobody
 * read again: an incident drill's clients got 79 × 504 and 18 × 503 at a
 * graceful restart while Prometheus saw at most 65 × 504 and none of the rest.
 *
 * The wait tunes itself: Prometheus reads at a fixed interval, so the next
 * scrape is expected one interval (the last gap between two scrapes) after
 * the last, and given half an interval more before the drain goes on without
 * it; a process read fewer than twice (nothing scrapes it regularly: a
 * developer's run, a test) does not wait at all.
 */
export class Scrapes {
  #last: number | undefined
  #interval: number | undefined
  #waiting: (() => void)[] = []
  readonly #now: () => number

  constructor(now: () => number = () => performance.now()) {
    this.#now = now
  }

  /** A scrape was answered (its counters are what the registry holds now). */
  seen(): void {
    const now = this.#now()
    if (this.#last !== undefined) this.#interval = now - this.#last
    this.#last = now
    for (const resolve of this.#waiting.splice(0)) resolve()
  }

  /** How long `next` would wait at most, given `maxMs`: 0 when nothing scrapes regularly. */
  patienceMs(maxMs: number): number {
    if (this.#interval === undefined || this.#last === undefined || this.#interval <= 0) return 0
    const now = this.#now()
    const expected = this.#last + this.#interval * Math.max(1, Math.ceil((now - this.#last) / this.#interval))
    return Math.min(maxMs, expected + this.#interval / 2 - now)
  }

  /** Resolves true at the next scrape, false when none came within patienceMs(maxMs). */
  next(maxMs: number): Promise<boolean> {
    const patience = this.patienceMs(maxMs)
    if (patience <= 0) return Promise.resolve(false)
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), patience)
      this.#waiting.push(() => {
        clearTimeout(timer)
        resolve(true)
      })
    })
  }
}
