/**
 * Who sent a request, as far as the service can tell: the client's address
 * and whether it reached us over TLS. Found once, at the edge (http/edge.ts),
 * and read by whatever needs it (the admin's sign-in throttle, its sessions
 * list, the Secure cookie flag, HSTS).
 *
 * The address is the socket's (Bun's server.requestIP), unless TRUST_PROXY=N
 * says N reverse proxies stand in front: then it is the Nth X-Forwarded-For
 * entry from the right, the one our outermost proxy wrote (entries further
 * left are whatever the client sent, and anyone can send anything). Without
 * TRUST_PROXY, X-Forwarded-For and X-Forwarded-Proto are ignored: a client
 * talking to us directly could otherwise pick its own address for every
 * attempt and never be throttled.
 */
import { isIP } from 'node:net'

export interface RequestMeta {
  /** The client's IP address (IPv4-mapped IPv6 as plain IPv4), or "unknown". */
  readonly address: string
  /** Reached us over TLS: our own URL is https, or a trusted proxy says X-Forwarded-Proto: https. */
  readonly secure: boolean
  /** The request URL's path, parsed once for every layer that needs it (pathnameOf). */
  readonly pathname?: string
}

const metas = new WeakMap<Request, RequestMeta>()

export function rememberMeta(request: Request, meta: RequestMeta): void {
  metas.set(request, meta)
}

/** What the edge found for this request; a request that did not come through it (app.handle in tests) is "unknown". */
export function requestMeta(request: Request): RequestMeta {
  return metas.get(request) ?? { address: 'unknown', secure: request.url.startsWith('https:') }
}

/**
 * The request's path as URL parses it. The edge, the metrics, the request
 * log and the plugin each need it: parsed once, in clientMeta, for a request
 * served on a socket (four parses of the same URL were 2 µs of a 40 µs
 * replay); parsed here for one handed in directly (tests, another app's fetch).
 */
export function pathnameOf(request: Request): string {
  return metas.get(request)?.pathname ?? new URL(request.url).pathname
}

/** The address without the IPv4-mapped prefix (`::ffff:127.0.0.1` is 127.0.0.1), lower case. */
export function normalizeAddress(address: string): string {
  const lower = address.trim().toLowerCase()
  const mapped = /^::ffff:(\d{1,3}(\.\d{1,3}){3})$/.exec(lower)
  return mapped ? mapped[1]! : lower
}

/** What a request says of its client, given its socket address and how many proxies we trust. */
export function clientMeta(request: Request, socketAddress: string | undefined, trustProxy: number): RequestMeta {
  let address = socketAddress ? normalizeAddress(socketAddress) : 'unknown'
  const url = new URL(request.url)
  let secure = url.protocol === 'https:'
  if (trustProxy > 0) {
    const forwarded = listOf(request.headers.get('x-forwarded-for'))
    const entry = forwarded.length === 0 ? undefined : forwarded[Math.max(0, forwarded.length - trustProxy)]
    const candidate = entry?.replace(/^\[(.*)\]$/, '$1')
    // A value that is not an address (garbage, a name, a port) is ignored, never used as a key or logged as one.
    if (candidate && isIP(candidate) !== 0) address = normalizeAddress(candidate)
    const proto = listOf(request.headers.get('x-forwarded-proto')).at(-1)
    if (proto !== undefined) secure = proto.toLowerCase() === 'https'
  }
  return { address, secure, pathname: url.pathname }
}

function listOf(header: string | null): string[] {
  if (!header) return []
  return header.split(',').map((part) => part.trim()).filter((part) => part !== '')
}
