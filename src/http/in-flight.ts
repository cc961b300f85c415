import type { Lease } from '../core/types'

/**
 * The leases held by requests still running, so a shutdown can wait for them
 * and release whatever outlives its deadline.
 */
export class InFlight {
  readonly #leases = new Set<Lease>()
  #idle: (() => void) | undefined

  get size(): number {
    return this.#leases.size
  }

  get leases(): readonly Lease[] {
    return [...this.#leases]
  }

  enter(lease: Lease): () => void {
    this.#leases.add(lease)
    return () => {
      this.#leases.delete(lease)
      if (this.#leases.size === 0) this.#idle?.()
    }
  }

  /** Resolves true when nothing is in flight, false if `timeoutMs` passes first. */
  async drained(timeoutMs: number): Promise<boolean> {
    if (this.#leases.size === 0) return true
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(this.#leases.size === 0), timeoutMs)
      this.#idle = () => {
        clearTimeout(timer)
        resolve(true)
      }
    })
  }
}
