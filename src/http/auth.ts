/**
 * Bearer API keys → tenant. Compared through a Map lookup on the whole key;
 * the set of keys is small and fixed at start.
 */
export function bearerTenant(apiKeys: ReadonlyMap<string, string>) {
  return function tenantOf(request: Request): string | undefined {
    const header = request.headers.get('authorization')
    if (!header) return undefined
    const match = /^Bearer ([!-~]{1,256})$/i.exec(header.trim())
    return match ? apiKeys.get(match[1]!) : undefined
  }
}
