import type { ClaimResult, Lease } from '../core/types'
import { release } from '../core/release'
import type { Database } from './route'

/**
 * When a claim's answer was lost (its connection reset, or it timed out), the
 * key may have been claimed under our lease after all: we release it under
 * that lease, now and then twice more, in case the statement was still
 * running. A release is conditional on our lease, so it never touches another
 * request's claim. Meanwhile the heartbeat no longer lists the lease, so a
 * retry or an operator may take the key over within a beat or two anyway.
 */
export const LOST_CLAIM_RELEASES_MS = [0, 1_000, 4_000] as const

/**
 * A claim that failed (reset, terminated, timed out) may have committed:
 * release the key under our lease, when its late answer arrives and at each
 * of LOST_CLAIM_RELEASES_MS until one release finds it. Every step is
 * caught: nothing here may reject unhandled (invariant 9).
 */
export function recoverLostClaim(short: Database, lease: Pick<Lease, 'tenant' | 'key' | 'lease'>, claiming: Promise<ClaimResult>, onReleased: () => void): void {
  const giveBack = () => release(short, lease, 'lost_claim').then((released) => {
    if (released) onReleased()
    return released
  }, () => false)
  claiming.then((late) => {
    if (late.kind === 'created' || late.kind === 'reclaimed') void giveBack()
  }, () => undefined)
  let attempt = 0
  const next = () => {
    const wait = LOST_CLAIM_RELEASES_MS[attempt++]
    if (wait === undefined) return
    const timer = setTimeout(() => void giveBack().then((released) => { if (!released) next() }), wait)
    timer.unref?.()
  }
  next()
}
