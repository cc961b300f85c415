import type { Lease } from './types'

/**
 * The idempotency key we send to the payment provider (or any foreign
 * service) for one logical request.
 *
 * Derived from (tenant, key, request_id), so it is:
 * - the same on every re-execution of the request: a reclaim, a retry after a
 *   release, a crash or a lost answer all keep the row's request_id, and the
 *   provider answers the charge it already made instead of charging again;
 * - different for another tenant using the same key string;
 * - different for a new request under a key whose retention ended, or a key
 *   reused with another body after a release: those get a new request_id.
 * Hashed rather than concatenated: it shows the provider neither the tenant
 * nor the client's key, and its length is fixed (4 + 43 characters).
 */
export function downstreamKey(lease: Pick<Lease, 'tenant' | 'key' | 'requestId'>): string {
  const hasher = new Bun.CryptoHasher('sha256')
  // NUL occurs in none of the three (tenant and key are printable, the id a uuid).
  hasher.update(`${lease.tenant}\u0000${lease.key}\u0000${lease.requestId}`)
  return `idp_${hasher.digest('base64url')}`
}
