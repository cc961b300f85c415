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
  /** The request URL's path, found once for every layer that needs it (pathnameOf). */
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
 * log and the plugin each need it: found once, in clientMeta, for a request
 * served on a socket (four parses of the same URL were 2 µs of a 40 µs
 * replay); found here for one handed in directly (tests, another app's fetch).
 */
export function pathnameOf(request: Request): string {
  return metas.get(request)?.pathname ?? pathOfUrl(request.url)
}

/**
 * The path of a serialized URL, which `Request.url` always is (Bun writes the
 * request line's target as the URL parser does: dot segments resolved,
 * backslashes as slashes, the host ours): what follows the authority, up to
 * the query or the fragment. Slicing the string costs a fraction of parsing
 * it again (`new URL`), and gives the same path (test/http/client-address.test.ts).
 */
export function pathOfUrl(url: string): string {
  const start = url.indexOf('/', url.indexOf('//') + 2)
  if (start < 0) return '/'
  let end = url.length
  const query = url.indexOf('?', start)
  if (query >= 0) end = query
  const fragment = url.indexOf('#', start)
  if (fragment >= 0 && fragment < end) end = fragment
  return url.slice(start, end)
}

/**
 * One spelling per address, so one client is one throttle bucket: IPv6 in
 * its canonical form (lower case, zeros compressed, by the URL parser), and
 * an IPv4-mapped IPv6 address in any spelling (`::ffff:127.0.0.1`,
 * `0:0:0:0:0:ffff:7f00:1`) as the IPv4 address it is.
 */
export function normalizeAddress(address: string): string {
  const trimmed = address.trim().toLowerCase()
  if (isIP(trimmed) !== 6) return trimmed
  let canonical: string
  try {
    canonical = new URL(`http://[${trimmed}]/`).hostname.slice(1, -1)
  } catch {
    return trimmed
  }
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(canonical)
  if (!mapped) return canonical
  const [high, low] = [parseInt(mapped[1]!, 16), parseInt(mapped[2]!, 16)]
  return [high >> 8, high & 255, low >> 8, low & 255].join('.')
}

/**
 * What a request says of its client, given its socket address (or how to
 * ask for it) and how many proxies we trust. The address is found when first
 * read: most requests never need it (a replay, a payment), and asking Bun for
 * a socket's address was a tenth of a replay's cost. Read it while the
 * request is being answered (the socket is gone afterwards).
 */
export function clientMeta(request: Request, socketAddress: string | undefined | (() => string | undefined), trustProxy: number): RequestMeta {
  const url = request.url
  let secure = url.startsWith('https:')
  if (trustProxy > 0) {
    const proto = listOf(request.headers.get('x-forwarded-proto')).at(-1)
    if (proto !== undefined) secure = proto.toLowerCase() === 'https'
  }
  return new ClientMeta(secure, pathOfUrl(url), () => clientAddress(request, () => {
    const socket = typeof socketAddress === 'function' ? socketAddress() : socketAddress
    return socket ? normalizeAddress(socket) : 'unknown'
  }, trustProxy))
}

class ClientMeta implements RequestMeta {
  #address: string | undefined
  constructor(readonly secure: boolean, readonly pathname: string, private readonly find: () => string) {}

  get address(): string {
    return this.#address ??= this.find()
  }
}

function clientAddress(request: Request, socket: () => string, trustProxy: number): string {
  if (trustProxy === 0) return socket()
  // Strict: the entry our N-th proxy wrote, counted from the right. With fewer entries the request did
  // not come through N proxies, and what is left of the header is the client's own (spoofable): the
  // socket's address stands. A proxy's `ip:port` ([v6]:port) is taken without its port; a value that is
  // not an address ("unknown", a name, garbage) is ignored, never used as a key or logged as one.
  const forwarded = listOf(request.headers.get('x-forwarded-for'))
  const entry = forwarded.length >= trustProxy ? forwarded[forwarded.length - trustProxy] : undefined
  const candidate = entry === undefined ? undefined : withoutPort(entry)
  return candidate && isIP(candidate) !== 0 ? normalizeAddress(candidate) : socket()
}

/** `1.2.3.4:5678` → `1.2.3.4`, `[::1]:5678` and `[::1]` → `::1`; a bare IPv6 address (colons, no brackets) as it is. */
function withoutPort(entry: string): string {
  const bracketed = /^\[([^\]]+)\](?::\d{1,5})?$/.exec(entry)
  if (bracketed) return bracketed[1]!
  const v4 = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/.exec(entry)
  return v4 ? v4[1]! : entry
}

function listOf(header: string | null): string[] {
  if (!header) return []
  return header.split(',').map((part) => part.trim()).filter((part) => part !== '')
}
