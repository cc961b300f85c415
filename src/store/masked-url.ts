/**
 * A database URL fit to print (the start banner): its password masked, found
 * by URL parsing rather than a pattern, so `postgres://:secret@host` (no user)
 * and libpq's `?password=` are masked too.
 */
export function maskedUrl(raw: string): string {
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    // Not a URL we can parse: none of it is printed, rather than a password.
    return '(not shown: not a URL)'
  }
  if (url.password) url.password = '***'
  if (url.searchParams.has('password')) url.searchParams.set('password', '***')
  return url.toString()
}
