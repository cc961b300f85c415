/**
 * A URL fit to print (the start banner, a log line, a refusal), masked by its
 * shape rather than by a list of secret-looking names (issue 41: a list let
 * `client_secret`, `x-amz-signature`, `sig`, `sk`, a path token and a
 * `#token=` fragment through). What is kept, and what is masked:
 *
 * - kept: the scheme, the host(s) and the port, and the path's shape;
 * - userinfo: the user and the password are each `***` (a provider's user
 *   name is often its API key; SPEC: a URL shows its host, never its user);
 * - the query: parameter names only, every value `***` (`?sslmode=***`:
 *   no value is known to be harmless, so none is printed);
 * - the fragment: `#***`;
 * - a path segment or a query parameter's name that looks like a token is
 *   `***`. Looks like a token: percent-decoded, 32 characters or more, or
 *   a run of 16 or more letters and digits with both in it
 *   (`sk_live_4eC39HqLyjWDarjtT1zdp7dc`, a hex digest, a UUID, a webhook's
 *   `B00000000/XXXXXXXX1XXXXXXXXXXXXXXX`). Words, names and short ids (`v1`,
 *   `charges`, `X-Amz-Credential`, `payments`, `idem_test_1a2b3c4d`,
 *   `2026-12-06`) are kept, so an operator still sees where the URL points.
 *   Not recognised: a path secret of under 32 characters without such a run
 *   (letters only, or short parts between `-` or `_`); put secrets in the
 *   userinfo or a parameter's value, which are always masked.
 *
 * A URL that does not parse prints nothing of itself.
 */
export function maskedUrl(raw: string): string {
  const { single } = splitHosts(raw)
  let url: URL
  try {
    url = new URL(single)
  } catch {
    // Not a URL we can parse: none of it is printed, rather than a password.
    return '(not shown: not a URL)'
  }
  const userinfo = url.username || url.password ? `${url.username ? MASK : ''}${url.password ? `:${MASK}` : ''}@` : ''
  // An opaque URL (mailto:, data:) has no host: its whole path may be the secret.
  const hierarchical = single.slice(url.protocol.length).startsWith('//')
  const path = hierarchical ? url.pathname.split('/').map((segment) => (looksLikeToken(segment) ? MASK : segment)).join('/') : url.pathname ? MASK : ''
  const names = url.search.slice(1).split('&').filter((part) => part !== '').map((part) => {
    const name = part.split('=', 1)[0]!
    return looksLikeToken(name) ? MASK : `${name}=${MASK}`
  })
  const query = names.length > 0 ? `?${names.join('&')}` : ''
  const fragment = url.hash ? `#${MASK}` : ''
  return `${url.protocol}${hierarchical ? '//' : ''}${userinfo}${hierarchical ? hostsAsWritten(raw) : ''}${path}${query}${fragment}`
}

/** The host(s) and port(s) as written (the WHATWG parser drops a default port: `https://h:443` is kept so). */
function hostsAsWritten(raw: string): string {
  const rest = raw.slice(raw.indexOf('://') + 3)
  const end = rest.search(/[/?#]/)
  const authority = end < 0 ? rest : rest.slice(0, end)
  return authority.slice(authority.lastIndexOf('@') + 1)
}

const MASK = '***'

/** The shape of a token (see the module's comment): long, or a long run of letters and digits mixed. */
export function looksLikeToken(encoded: string): boolean {
  let text: string
  try {
    text = decodeURIComponent(encoded)
  } catch {
    text = encoded
  }
  const length = [...text].length
  if (length >= 32) return true
  return (text.match(/[\p{L}\p{Nd}]{16,}/gu) ?? []).some((run) => /\p{L}/u.test(run) && /\p{Nd}/u.test(run))
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
