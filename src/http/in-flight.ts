import type { Lease } from '../core/types'

interface Entry {
  readonly lease: Lease
  readonly abort: (reason: Error) => void
}

/**
 * The requests still running, so a shutdown can wait for them, and stop
 * those that outlive its deadline (each then releases its own key).
 */
export class InFlight {
  readonly #entries = new Set<Entry>()
  #idle: (() => void) | undefined

  get size(): number {
    return this.#entries.size
  }

  get leases(): readonly Lease[] {
    return [...this.#entries].map((entry) => entry.lease)
  }

  enter(lease: Lease, abort: (reason: Error) => void = () => undefined): () => void {
    const entry = { lease, abort }
    this.#entries.add(entry)
    return () => {
      this.#entries.delete(entry)
      if (this.#entries.size === 0) this.#idle?.()
    }
  }

  /** Stops every request still running: their external step is aborted, their key released. */
  abortAll(reason: Error): void {
    for (const entry of this.#entries) entry.abort(reason)
  }

  /** Resolves true when nothing is in flight, false if `timeoutMs` passes first. */
  async drained(timeoutMs: number): Promise<boolean> {
    if (this.#entries.size === 0) return true
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(this.#entries.size === 0), timeoutMs)
      this.#idle = () => {
        clearTimeout(timer)
        resolve(true)
      }
    })
  }
}
