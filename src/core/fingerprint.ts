/**
 * The request fingerprint: what makes a retry "the same request".
 * Method and path are compared as sent; the body as canonical JSON, so key
 * order and white space do not count but every value does.
 */

/** JSON with object keys sorted at every depth and no white space. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value)
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`
  const entries = Object.keys(value as Record<string, unknown>)
    .sort()
    .map((key) => `${JSON.stringify(key)}:${canonicalJson((value as Record<string, unknown>)[key])}`)
  return `{${entries.join(',')}}`
}

export function fingerprint(method: string, path: string, body: unknown): string {
  // NUL cannot occur in a method, path or JSON text, so the parts cannot run into each other.
  // One-shot: no hasher object per request.
  return Bun.CryptoHasher.hash('sha256', `${method}\u0000${path}\u0000${canonicalJson(body)}`, 'hex')
}
