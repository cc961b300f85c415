/** Query parameters that carry a secret in the URLs people write (libpq's password, a provider's key or token). */
const SECRET_PARAMS = /^(password|pass|pwd|secret|token|key|api[-_]?key|access[-_]?token|auth)$/i

/**
 * A URL fit to print (the start banner): its password and secret-looking
 * query parameters masked, found by URL parsing rather than a pattern, so
 * `postgres://:secret@host` (no user) and libpq's `?password=` are masked
 * too. `user: true` masks the user name as well: for Basic auth a provider's
 * user name is often its API key.
 */
export function maskedUrl(raw: string, options: { user?: boolean } = {}): string {
  const { hosts, single } = splitHosts(raw)
  let url: URL
  try {
    url = new URL(single)
  } catch {
    // Not a URL we can parse: none of it is printed, rather than a password.
    return '(not shown: not a URL)'
  }
  if (url.password) url.password = '***'
  if (options.user && url.username) url.username = '***'
  for (const name of [...url.searchParams.keys()]) if (SECRET_PARAMS.test(name)) url.searchParams.set(name, '***')
  const text = url.toString()
  if (hosts === undefined) return text
  const at = text.indexOf(url.host, text.indexOf('://') + 3)
  return `${text.slice(0, at)}${hosts}${text.slice(at + url.host.length)}`
}

/**
 * postgres.js's multi-host form (`postgres://u@host1:5432,host2:5432/db`,
 * as libpq writes it for a Patroni cluster) is no URL the WHATWG parser takes:
 * `single` is it with its first host only, as postgres.js itself parses it;
 * `hosts` the host list, when there is more than one.
 */
export function splitHosts(raw: string): { hosts: string | undefined; single: string } {
  const scheme = raw.indexOf('://')
  if (scheme < 0) return { hosts: undefined, single: raw }
  const rest = raw.slice(scheme + 3)
  const end = rest.search(/[/?#]/)
  const authority = end < 0 ? rest : rest.slice(0, end)
  const at = authority.lastIndexOf('@')
  const hosts = authority.slice(at + 1)
  if (!hosts.includes(',')) return { hosts: undefined, single: raw }
  return { hosts, single: `${raw.slice(0, scheme + 3)}${authority.slice(0, at + 1)}${hosts.split(',')[0]}${rest.slice(authority.length)}` }
}
