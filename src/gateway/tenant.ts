/**
 * The tenant of a gateway request: a digest of its client credential (the
 * `Authorization` field by default, GATEWAY_TENANT_HEADER names another), so
 * the same key from two credentials is two requests, and the credential
 * itself is never stored: the key rows, logs and the admin page see only the
 * digest. The field is forwarded unchanged; the upstream authenticates.
 *
 * SHA-256, base64url, 32 characters (192 bits: no two credentials meet);
 * `gw:` marks the gateway's tenants among the payments service's when both
 * share a database. A request without the field is the `gw:anonymous`
 * tenant: keys of every client that sends none share one scope.
 */
export const ANONYMOUS_TENANT = 'gw:anonymous'

export function tenantOf(request: Request, field: string): string {
  const credential = request.headers.get(field)
  if (credential === null || credential === '') return ANONYMOUS_TENANT
  return `gw:${Bun.CryptoHasher.hash('sha256', credential, 'base64url').slice(0, 32)}`
}
