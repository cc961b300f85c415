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
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    // Not a URL we can parse: none of it is printed, rather than a password.
    return '(not shown: not a URL)'
  }
  if (url.password) url.password = '***'
  if (options.user && url.username) url.username = '***'
  for (const name of [...url.searchParams.keys()]) if (SECRET_PARAMS.test(name)) url.searchParams.set(name, '***')
  return url.toString()
}
