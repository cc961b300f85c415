/**
 * Which tenant is held at its limits (SPEC, Metrics: "refusals by tenant").
 * A tenant refused 12,000 times left no trace before: no label, no log line,
 * no alert, nothing on the admin page. Now each refusal is
 * - counted in `http_tenant_refusals_total{tenant, reason}` (bounded: the
 *   tenants of API_KEYS, fixed at start; every series starts at 0, so the
 *   alert sees the first refusals);
 * - logged as a sample: one line at a tenant's first refusal in a window,
 *   and at the next one after it, with how many the window held, never a
 *   line per refusal (a throttled tenant is thousands of them);
 * - kept per tenant for the admin page: refusals in the last window, and
 *   when the last one was.
 * Per process, as the limits are (http/rate-limit.ts).
 */
import type { Counter } from 'prom-client'
import { log as processLog, type Logger } from '../log'
import { requestIdOf } from './request-id'

export type RefusalReason = 'rate_limited' | 'too_many_in_flight'
export const REFUSAL_REASONS: readonly RefusalReason[] = ['rate_limited', 'too_many_in_flight']

/** A sample's window: a minute, the alert's and the page's unit too. */
export const REFUSAL_WINDOW_MS = 60_000

export interface TenantHeld {
  readonly tenant: string
  /** Refusals in the current window, by reason. */
  readonly refused: Readonly<Record<RefusalReason, number>>
  /** Date.now() of the last one. */
  readonly lastAt: number
}

interface Window {
  startedAt: number
  lastAt: number
  refused: Record<RefusalReason, number>
}

export class TenantRefusals {
  readonly #windows = new Map<string, Window>()

  constructor(
    private readonly counter: Counter<'tenant' | 'reason'> | undefined,
    private readonly log: Logger = processLog,
    private readonly now: () => number = Date.now,
  ) {}

  refused(request: Request, tenant: string, reason: RefusalReason): void {
    this.counter?.inc({ tenant, reason })
    const now = this.now()
    let window = this.#windows.get(tenant)
    if (!window || now - window.startedAt >= REFUSAL_WINDOW_MS) {
      const fields = { tenant, reason, request_id: requestIdOf(request) }
      if (window && now - window.lastAt < REFUSAL_WINDOW_MS) {
        // Still going on: the window's sum, once a window.
        this.log.warn(`tenant ${tenant} still held at its limits: ${total(window)} request(s) refused in the last ${Math.round((now - window.startedAt) / 1000)} s`, { ...fields, refused: { ...window.refused } })
      } else {
        this.log.warn(`tenant ${tenant} held at its limit (${reason}): further refusals are counted, and summed up here once a minute while they go on`, fields)
      }
      window = { startedAt: now, lastAt: now, refused: { rate_limited: 0, too_many_in_flight: 0 } }
      this.#windows.set(tenant, window)
    }
    window.refused[reason]++
    window.lastAt = now
  }

  /** Tenants refused within the last window, most refused first (the admin page). */
  held(): TenantHeld[] {
    const now = this.now()
    return [...this.#windows].filter(([, window]) => now - window.lastAt < REFUSAL_WINDOW_MS)
      .map(([tenant, window]) => ({ tenant, refused: { ...window.refused }, lastAt: window.lastAt }))
      .sort((a, b) => total(b) - total(a))
  }
}

const total = (held: Pick<TenantHeld, 'refused'>) => held.refused.rate_limited + held.refused.too_many_in_flight
