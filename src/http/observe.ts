/**
 * Counts and times every answer of a fetch handler, 4xx from auth and body
 * checks included, with the route *template* as its label: paths are
 * client-chosen, and mapping them to the app's own fixed list keeps a hostile
 * client from creating series at will. The app gives the list; anything else
 * is `other`.
 */
import { pathnameOf } from './client'

export interface AnswerEvent {
  /** One of the usual methods, else `OTHER`. */
  readonly method: string
  /** The matching template of the app's list, or `other`. */
  readonly route: string
  readonly status: number
  readonly seconds: number
}

const METHODS = new Set(['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'])

/**
 * Templates as Elysia writes them: `:name` matches one path segment; a
 * trailing `/*` matches the prefix and anything below it, labelled by the
 * prefix (`/admin/*` → `/admin`). The first match wins, so list the specific
 * ones first.
 */
export function routeLabeler(templates: readonly string[]): (pathname: string) => string {
  const compiled = templates.map((template) => {
    const wildcard = template.endsWith('/*')
    const base = wildcard ? template.slice(0, -2) : template
    const pattern = base.split('/').map((part) => part.startsWith(':') ? '[^/]+' : part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('/')
    return [new RegExp(`^${pattern}${wildcard ? '(/.*)?' : ''}/?$`), base || '/'] as const
  })
  return function routeLabel(pathname: string): string {
    for (const [pattern, label] of compiled) if (pattern.test(pathname)) return label
    return 'other'
  }
}

/** Wraps `fetch` so that `onAnswer` hears of every answer, labelled by `routes`. */
export function observed(routes: readonly string[], onAnswer: (event: AnswerEvent) => void, fetch: (request: Request) => Promise<Response>) {
  const routeLabel = routeLabeler(routes)
  return async function observedFetch(request: Request): Promise<Response> {
    const started = performance.now()
    const response = await fetch(request)
    onAnswer({
      method: METHODS.has(request.method) ? request.method : 'OTHER',
      route: routeLabel(pathnameOf(request)),
      status: response.status,
      seconds: (performance.now() - started) / 1000,
    })
    return response
  }
}
