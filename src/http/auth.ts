/**
 * Bearer API keys → tenant. Looked up by the key's SHA-256, not the key: a
 * lookup's timing then depends on a digest the client cannot steer byte by
 * byte, never on how much of a real key a guess shares (a Map of the keys
 * themselves compares strings on a hash collision). Wrong keys are counted
 * and throttled per address besides (failed-credentials.ts). The set of keys
 * is small and fixed at start; each request's answer is kept with it, since
 * the edge and the route both ask.
 */
export function bearerTenant(apiKeys: ReadonlyMap<string, string>) {
  const byDigest = new Map([...apiKeys].map(([key, tenant]) => [digestOf(key), tenant]))
  const found = new WeakMap<Request, string | undefined>()
  return function tenantOf(request: Request): string | undefined {
    if (found.has(request)) return found.get(request)
    const token = bearerToken(request)
    const tenant = token === undefined ? undefined : byDigest.get(digestOf(token))
    found.set(request, tenant)
    return tenant
  }
}

/** One-shot SHA-256 (0.18 µs here, against 0.53 µs for a CryptoHasher made per call). */
function digestOf(token: string): string {
  return Bun.SHA256.hash(token, 'base64')
}

/** The token of `Authorization: Bearer <token>`, if the request has one of the right shape. */
export function bearerToken(request: Request): string | undefined {
  const header = request.headers.get('authorization')
  if (!header) return undefined
  return /^Bearer ([!-~]{1,256})$/i.exec(header.trim())?.[1]
}
