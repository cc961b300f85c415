/**
 * The Host allow-list, against DNS rebinding: a page on attacker.example
 * whose name is made to resolve to 127.0.0.1 can send requests to a service
 * on a laptop and read the answers, as if it were that service's own page.
 * The browser still sends `Host: attacker.example`, so refusing names we do
 * not serve stops it.
 *
 * Always allowed: IP literals (a rebinding needs a name; the browser sends
 * the name, never the address it resolved) and `localhost` (browsers resolve
 * it to loopback themselves). So a laptop, a container probed by IP and a
 * health check need nothing set. Any other name must be in ALLOWED_HOSTS
 * (the listen HOST, when a name, is added by config.ts), or ALLOWED_HOSTS=*.
 */
import { isIP } from 'node:net'

export interface AllowedHosts {
  readonly any: boolean
  /** Lower-case names; one starting with "." allows that domain and every name under it. */
  readonly names: readonly string[]
}

/** The host name of a Host header value: no port, no brackets, lower case; undefined when malformed. */
export function hostName(header: string): string | undefined {
  const value = header.trim().toLowerCase()
  const bracketed = /^\[([0-9a-f:.]+)\](:\d{1,5})?$/.exec(value)
  if (bracketed) return bracketed[1]
  const plain = /^([a-z0-9._-]+)(:\d{1,5})?$/.exec(value)
  return plain ? plain[1]!.replace(/\.$/, '') : undefined
}

export function isAllowedHost(header: string | null, allowed: AllowedHosts): boolean {
  if (allowed.any) return true
  // HTTP/1.0 without Host is served with our listen address as its origin (server.ts).
  if (header === null) return true
  const name = hostName(header)
  if (name === undefined) return false
  if (isIP(name) !== 0 || name === 'localhost' || name.endsWith('.localhost')) return true
  return allowed.names.some((allowedName) => allowedName.startsWith('.')
    ? name === allowedName.slice(1) || name.endsWith(allowedName)
    : name === allowedName)
}
