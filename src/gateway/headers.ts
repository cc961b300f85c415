/**
 * Which header fields cross the gateway, each way, and which a replay repeats.
 *
 * Hop-by-hop fields (RFC 9110 §7.6.1) belong to one connection: a proxy drops
 * them, and every field the `Connection` field names, before forwarding, in
 * both directions. `Proxy-Connection` and `Keep-Alive` are the legacy ones
 * the RFC tells intermediaries to drop too. `Host` and `Content-Length` are
 * set again for the next hop (the upstream's authority, the body as sent).
 */
const HOP_BY_HOP = ['connection', 'proxy-connection', 'keep-alive', 'te', 'trailer', 'transfer-encoding', 'upgrade'] as const

/**
 * Fields of the upstream's first answer that a replay does not repeat: a
 * cookie set once must not be set again on every retry (a session per
 * retry), `Date` says when the first answer was made (the replay gets its
 * own), and the lengths and framing are the replay's own. Configurable
 * (GATEWAY_UNREPLAYED_HEADERS), these are the default.
 */
export const DEFAULT_UNREPLAYED_HEADERS: readonly string[] = ['set-cookie', 'date', 'age', 'expires', 'content-length']

/** Marks a stored answer whose body is base64 (not UTF-8, or has a NUL): never sent to a client (replay removes it). */
export const STORED_ENCODING_HEADER = 'idempotency-gateway-body-encoding'

/** The hop-by-hop fields of `headers`: the fixed list and what its `Connection` names. */
function hopByHop(headers: Headers): Set<string> {
  const names = new Set<string>(HOP_BY_HOP)
  for (const token of (headers.get('connection') ?? '').split(',')) {
    const name = token.trim().toLowerCase()
    if (name) names.add(name)
  }
  return names
}

export interface ForwardedFor {
  /** The client's address, as the socket says. */
  readonly client?: string | undefined
  /** The Host the client asked the gateway for. */
  readonly host?: string | undefined
  readonly proto: 'http' | 'https'
}

/** A `Forwarded` element (RFC 7239): `for`, `host`, `proto`, quoted where the grammar needs it. */
export function forwardedElement(by: ForwardedFor): string {
  const quote = (value: string) => (/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(value) ? value : `"${value.replace(/[\\"]/g, '\\$&')}"`)
  const parts: string[] = []
  if (by.client) parts.push(`for=${quote(by.client.includes(':') ? `[${by.client}]` : by.client)}`)
  if (by.host) parts.push(`host=${quote(by.host)}`)
  parts.push(`proto=${by.proto}`)
  return parts.join(';')
}

/**
 * The request's fields for the upstream: less hop-by-hop, `Host` and
 * `Content-Length` (the fetch sets both), with `Forwarded` appended to any
 * the client's proxies added, and `Idempotency-Key` replaced by the
 * gateway's derived key when there is one (the client's key is scoped by
 * its tenant here; the upstream gets one of ours, the same on every re-run).
 */
export function requestHeadersForUpstream(incoming: Headers, forwarded: ForwardedFor, idempotencyKey?: string): Headers {
  const drop = hopByHop(incoming)
  const out = new Headers()
  incoming.forEach((value, name) => {
    if (!drop.has(name) && name !== 'host' && name !== 'content-length') out.append(name, value)
  })
  const element = forwardedElement(forwarded)
  const earlier = incoming.get('forwarded')
  out.set('forwarded', earlier ? `${earlier}, ${element}` : element)
  if (idempotencyKey !== undefined) out.set('idempotency-key', idempotencyKey)
  return out
}

/** The upstream's answer fields for the client: less hop-by-hop (and the length, which the gateway's answer sets). */
export function responseHeadersForClient(upstream: Headers): Headers {
  const drop = hopByHop(upstream)
  const out = new Headers()
  upstream.forEach((value, name) => {
    if (!drop.has(name) && name !== 'content-length') out.append(name, value)
  })
  // Headers iterates Set-Cookie joined; each cookie is its own field.
  if (upstream.has('set-cookie') && !drop.has('set-cookie')) {
    out.delete('set-cookie')
    for (const cookie of upstream.getSetCookie()) out.append('set-cookie', cookie)
  }
  return out
}

/**
 * The fields stored with the answer and replayed: the client's fields less
 * the unreplayed ones. Stored as one value per name (the engine stores a
 * record): a field sent several times is joined with ", ", as HTTP allows
 * for every field but Set-Cookie, which is never stored by default.
 */
export function storedHeaders(forClient: Headers, unreplayed: ReadonlySet<string>): Record<string, string> {
  const stored: Record<string, string> = {}
  forClient.forEach((value, name) => {
    if (unreplayed.has(name) || name === STORED_ENCODING_HEADER) return
    stored[name] = name === 'set-cookie' ? forClient.getSetCookie().join(', ') : value
  })
  return stored
}
