/**
 * Admin credentials: the ADMIN_TOKEN itself (Bearer, for scripts) or a signed
 * session cookie (for browsers, set by the sign-in form).
 *
 * The cookie is `<expires>.<nonce>.<name>.<mac>`, HMAC-SHA256 under a key
 * derived from ADMIN_TOKEN: changing the token signs everyone out. The CSRF
 * token is a second HMAC over the session's nonce, so it is tied to one
 * session and a page from another session (or another site) cannot forge it.
 */
import { createHmac, timingSafeEqual } from 'node:crypto'

export const SESSION_COOKIE = 'idem_admin'
/** Eight hours: one on-call shift; after it the operator signs in again. */
export const SESSION_SECONDS = 8 * 3600
/** Names operators give themselves for the audit trail: short, plain. */
const NAME_PATTERN = /^[A-Za-z0-9 ._@-]{1,40}$/

export interface Session {
  readonly nonce: string
  /** Who signed in, as they called themselves (for the audit trail). */
  readonly name: string
  readonly expiresAt: number
  readonly csrf: string
}

/** Equal without leaking where two strings differ: both are hashed to 32 bytes first. */
export function constantTimeEqual(a: string, b: string): boolean {
  const digest = (value: string) => new Bun.CryptoHasher('sha256').update(value).digest()
  return timingSafeEqual(digest(a), digest(b))
}

export function validName(name: string): boolean {
  return NAME_PATTERN.test(name)
}

export class SessionKeys {
  readonly #key: Buffer

  constructor(private readonly adminToken: string) {
    this.#key = createHmac('sha256', adminToken).update('idempotent-post admin session v1').digest()
  }

  /** True when `token` is the ADMIN_TOKEN (constant time). */
  isAdminToken(token: string): boolean {
    return constantTimeEqual(token, this.adminToken)
  }

  /** True when the request carries `Authorization: Bearer <ADMIN_TOKEN>`. */
  hasBearer(request: Request): boolean {
    const match = /^Bearer (\S{1,512})$/i.exec(request.headers.get('authorization')?.trim() ?? '')
    return match !== null && this.isAdminToken(match[1]!)
  }

  issue(name: string, nowMs = Date.now()): { session: Session; cookie: string } {
    const expiresAt = Math.floor(nowMs / 1000) + SESSION_SECONDS
    const nonce = Buffer.from(crypto.getRandomValues(new Uint8Array(16))).toString('base64url')
    const encodedName = Buffer.from(name).toString('base64url')
    const payload = `${expiresAt}.${nonce}.${encodedName}`
    return { session: this.#session(nonce, name, expiresAt), cookie: `${payload}.${this.#mac(payload)}` }
  }

  /** The session of a cookie value, or undefined when tampered with, malformed or expired. */
  verify(value: string | undefined, nowMs = Date.now()): Session | undefined {
    if (!value || value.length > 512) return undefined
    const parts = value.split('.')
    if (parts.length !== 4) return undefined
    const [expires, nonce, encodedName, mac] = parts as [string, string, string, string]
    if (!constantTimeEqual(mac, this.#mac(`${expires}.${nonce}.${encodedName}`))) return undefined
    const expiresAt = Number(expires)
    if (!Number.isSafeInteger(expiresAt) || expiresAt * 1000 <= nowMs) return undefined
    const name = Buffer.from(encodedName, 'base64url').toString()
    return validName(name) ? this.#session(nonce, name, expiresAt) : undefined
  }

  /** True when `token` is this session's CSRF token (constant time). */
  isCsrf(session: Session, token: string | null | undefined): boolean {
    return typeof token === 'string' && constantTimeEqual(token, session.csrf)
  }

  /** The CSRF token of a session. */
  csrfFor(nonce: string): string {
    return this.#mac(`csrf.${nonce}`)
  }

  #session(nonce: string, name: string, expiresAt: number): Session {
    return { nonce, name, expiresAt, csrf: this.csrfFor(nonce) }
  }

  #mac(payload: string): string {
    return createHmac('sha256', this.#key).update(payload).digest('base64url')
  }
}

export function readCookie(request: Request, name: string): string | undefined {
  const header = request.headers.get('cookie')
  if (!header) return undefined
  for (const part of header.split(';')) {
    const index = part.indexOf('=')
    if (index > 0 && part.slice(0, index).trim() === name) return part.slice(index + 1).trim()
  }
  return undefined
}

export function sessionCookie(value: string, secure: boolean, maxAgeSeconds = SESSION_SECONDS): string {
  // Path=/admin: the cookie never travels with API or metrics requests.
  return `${SESSION_COOKIE}=${value}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=${maxAgeSeconds}${secure ? '; Secure' : ''}`
}

/**
 * Cross-site check for state-changing requests (defence in depth next to the
 * CSRF token): a browser sends Sec-Fetch-Site and Origin with every POST;
 * anything but our own origin is refused. Clients that send neither (curl,
 * scripts) are judged by the CSRF token alone.
 */
export function sameOrigin(request: Request): boolean {
  const site = request.headers.get('sec-fetch-site')
  if (site !== null && site !== 'same-origin') return false
  const origin = request.headers.get('origin')
  if (origin === null) return true
  if (origin === 'null') return false
  try {
    const host = request.headers.get('host') ?? new URL(request.url).host
    return new URL(origin).host === host
  } catch {
    return false
  }
}
