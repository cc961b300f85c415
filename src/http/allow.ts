/**
 * Which methods a path is served with, from an Elysia app's routes: what a
 * 405's `Allow` lists (RFC 9110 §15.5.6), and whether a HEAD can be answered
 * as the GET it mirrors. A path no route serves is none (a 404), a path
 * under a route that takes every method (`.all`, e.g. the admin's mount)
 * is left to that route.
 */

export interface RouteLike {
  readonly method: string
  readonly path: string
}

export interface PathMethods {
  /** Methods routes serve on this path, upper case, sorted; with HEAD where GET is, and OPTIONS. Empty: no route has this path. */
  readonly allow: readonly string[]
  /** A route takes every method here: its own answer counts, not ours. */
  readonly any: boolean
}

/** Elysia's `:name` parameters match one segment, `*` the rest of the path. */
function patternOf(path: string): RegExp {
  const source = path.replace(/\/+$/, '').split('/').map((segment) => {
    if (segment === '*') return '.*'
    if (segment.startsWith(':')) return '[^/]+'
    return segment.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
  }).join('/')
  return new RegExp(`^${source}/?$`)
}

/** `methodsOf(app.routes)`: compiled once, asked per request. */
export function methodsOf(routes: readonly RouteLike[]): (pathname: string) => PathMethods {
  const compiled = routes.map((route) => ({ method: route.method.toUpperCase(), pattern: patternOf(route.path) }))
  return (pathname) => {
    const methods = new Set<string>()
    let any = false
    for (const route of compiled) {
      if (!route.pattern.test(pathname)) continue
      if (route.method === 'ALL') any = true
      else methods.add(route.method)
    }
    if (methods.size === 0) return { allow: [], any }
    if (methods.has('GET')) methods.add('HEAD')
    methods.add('OPTIONS')
    return { allow: [...methods].sort(), any }
  }
}
