/**
 * Bearer API keys → tenant. Compared through a Map lookup on the whole key;
 * the set of keys is small and fixed at start.
 */
export function bearerTenant(apiKeys: ReadonlyMap<string, string>) {
  return function tenantOf(request: Request): string | undefined {
    const token = bearerToken(request)
    return token === undefined ? undefined : apiKeys.get(token)
  }
}

/** The token of `Authorization: Bearer <token>`, if the request has one of the right shape. */
export function bearerToken(request: Request): string | undefined {
  const header = request.headers.get('authorization')
  if (!header) return undefined
  return /^Bearer ([!-~]{1,256})$/i.exec(header.trim())?.[1]
}
