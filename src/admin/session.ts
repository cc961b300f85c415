/**
 * The browser side of an admin session: its cookie (the session's random
 * token, HttpOnly, SameSite=Strict, Path=/admin; Secure over TLS), and the
 * cross-site check of state-changing forms. The session itself lives in the
 * database (sessions.ts); the CSRF token every form carries is derived from
 * the cookie's token, so a page of another session or another site cannot
 * know it.
 */
import { SESSION_MAX_SECONDS } from './sessions'

export const SESSION_COOKIE = 'idem_admin'
/**
 * Over TLS the cookie is `__Host-` prefixed: a browser takes it only with
 * Secure, Path=/ and no Domain, so a sibling subdomain cannot set one that
 * our pages would read (cookie tossing). Plain HTTP (development) cannot
 * carry the prefix; there the cookie keeps Path=/admin.
 */
export const SECURE_SESSION_COOKIE = `__Host-${SESSION_COOKIE}`
/** The cookie lives as long as a session can; the server ends it sooner when idle. */
export const SESSION_SECONDS = SESSION_MAX_SECONDS
/** Notes operators add to their name for the audit trail: short, plain. */
const NOTE_PATTERN = /^[A-Za-z0-9 ._@-]{1,40}$/

export function validNote(note: string): boolean {
  return NOTE_PATTERN.test(note)
}

/**
 * The value of cookie `name`, or undefined. Sent twice (another path's or a
 * sibling domain's cookie of the same name: the browser sends both, and the
 * first is not necessarily ours) it is none: the request counts as signed out
 * rather than as whichever session was tossed in first.
 */
export function readCookie(request: Request, name: string): string | undefined {
  const header = request.headers.get('cookie')
  if (!header) return undefined
  let found: string | undefined
  for (const part of header.split(';')) {
    const index = part.indexOf('=')
    if (index > 0 && part.slice(0, index).trim() === name) {
      if (found !== undefined) return undefined
      found = part.slice(index + 1).trim()
    }
  }
  return found
}

/** The session cookie of `request`: the `__Host-` one over TLS, the plain one otherwise (sessionCookie). */
export function readSessionCookie(request: Request, secure: boolean): string | undefined {
  return readCookie(request, secure ? SECURE_SESSION_COOKIE : SESSION_COOKIE)
}

export function sessionCookie(value: string, secure: boolean, maxAgeSeconds = SESSION_SECONDS): string {
  // Over TLS: __Host-, so Secure and Path=/ (the prefix demands both). Plain HTTP: Path=/admin, so it never travels with API or metrics requests.
  return secure
    ? `${SECURE_SESSION_COOKIE}=${value}; Path=/; HttpOnly; SameSite=Strict; Max-Age=${maxAgeSeconds}; Secure`
    : `${SESSION_COOKIE}=${value}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=${maxAgeSeconds}`
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

/** The audit actor: who the credential says, and what they noted, never the note alone. */
export function actorOf(prefix: 'admin' | 'api', operator: string, note: string | null | undefined): string {
  return note ? `${prefix}:${operator} (${note})` : `${prefix}:${operator}`
}
