import type { Lease } from '../core/types'

/** One request's claim, from before its statement is sent until the request ends. */
export interface ClaimTicket {
  /** The claim went through: the request holds `lease` and runs; `abort` stops it (a shutdown). */
  hold(lease: Lease, abort: (reason: Error) => void): void
  /** The request no longer works under this lease (it ended, failed, or its claim's answer was lost). */
  end(): void
}

interface Claim {
  readonly id: string
  held?: { lease: Lease; abort: (reason: Error) => void }
}

/**
 * What this process is serving, for two readers:
 *
 * - the drain: every request is counted from the moment it is accepted
 *   (`track`), not from its claim, so a request accepted an instant before
 *   SIGTERM is waited for too; while draining, no new claim starts (the
 *   plugin answers 503), and the pools close only after the last handler;
 * - the heartbeat: the leases of claims sent and not yet ended (`leaseIds`),
 *   listed from before the claim's statement is sent, so that a key this
 *   process claimed and does not list is known to be worked on by nobody
 *   (core/policy.ts workedOn).
 */
export class InFlight {
  readonly #claims = new Set<Claim>()
  readonly #tracked = new WeakSet<Request>()
  #requests = 0
  #draining = false
  #idle: (() => void)[] = []

  /** Requests accepted and not yet answered. */
  get size(): number {
    return this.#requests
  }

  get draining(): boolean {
    return this.#draining
  }

  /**
   * Counts `request` until the returned function is called (once; later calls
   * do nothing). The server counts every request at its edge and the plugin
   * its own (an app of a user may only have the plugin): a request counted
   * already is not counted twice.
   */
  track(request: Request): () => void {
    if (this.#tracked.has(request)) return () => undefined
    this.#tracked.add(request)
    this.#requests++
    let done = false
    return () => {
      if (done) return
      done = true
      this.#requests--
      if (this.#requests === 0) for (const resolve of this.#idle.splice(0)) resolve()
    }
  }

  /** Lists `leaseId` from now on (call before the claim is sent). */
  claiming(leaseId: string): ClaimTicket {
    const claim: Claim = { id: leaseId }
    this.#claims.add(claim)
    return {
      hold: (lease, abort) => { claim.held = { lease, abort } },
      end: () => { this.#claims.delete(claim) },
    }
  }

  /** The leases of every claim sent and not ended: the heartbeat lists them. */
  leaseIds(): string[] {
    return [...this.#claims].map((claim) => claim.id)
  }

  /** The keys held by running requests (a last-resort release at shutdown). */
  get leases(): readonly Lease[] {
    return [...this.#claims].flatMap((claim) => (claim.held ? [claim.held.lease] : []))
  }

  /** From now on no new claim starts; requests already running go on. */
  drain(): void {
    this.#draining = true
  }

  /** Stops every request still running: their external step is aborted, their key released. */
  abortAll(reason: Error): void {
    for (const claim of this.#claims) claim.held?.abort(reason)
  }

  /** Resolves true when no request is left, false if `timeoutMs` passes first. */
  async drained(timeoutMs: number): Promise<boolean> {
    if (this.#requests === 0) return true
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(this.#requests === 0), timeoutMs)
      this.#idle.push(() => {
        clearTimeout(timer)
        resolve(true)
      })
    })
  }
}
