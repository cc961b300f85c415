import { canonicalJson } from '../core/fingerprint'

/**
 * What makes a gateway retry "the same request": the method, the path with
 * its query, and the body. A JSON body (by its Content-Type) that parses
 * counts as canonical JSON, as the plugin's does (key order and white space
 * do not count: the upstream reads them the same); any other body counts by
 * its bytes and its media type. Hashed: the row keeps 64 hex characters,
 * never the body.
 */
export function gatewayFingerprint(method: string, pathAndQuery: string, contentType: string | null, body: Uint8Array): string {
  const media = (contentType ?? '').split(';')[0]!.trim().toLowerCase()
  let part: string | undefined
  if (/^application\/(?:[\w.+-]+\+)?json$/.test(media) && body.byteLength > 0) {
    try {
      part = `json\u0000${canonicalJson(JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body)))}`
    } catch {
      part = undefined
    }
  }
  part ??= `bytes\u0000${media}\u0000${Bun.CryptoHasher.hash('sha256', body, 'hex')}`
  // NUL occurs in none of the parts' own text (a method, a request target, hex, canonical JSON).
  return Bun.CryptoHasher.hash('sha256', `${method}\u0000${pathAndQuery}\u0000${part}`, 'hex')
}
