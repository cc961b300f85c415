import { html } from '@elysiajs/html'
import { Elysia } from 'elysia'
import { isUnavailable } from '../core/errors'
import { problemResponse, problems } from '../http/problem'
import type { Metrics } from '../metrics/registry'
import type { Pools } from '../store/db'
import { handleApi } from './api'
import { handlePage, htmlResponse, RenderedPage, type AdminAnswer, type PageContext } from './page'
import { MessagePage } from './pages'
import { SessionKeys } from './session'

export interface AdminOptions {
  readonly pools: Pools
  /** ADMIN_TOKEN: the Bearer token of the JSON API and the password of the sign-in form. */
  readonly adminToken: string
  /** Age after which a processing key counts as stale. @default 30 */
  readonly ttlSeconds?: number
  /** How long completed keys are kept (the purge deletes them after). @default 86400 */
  readonly retentionSeconds?: number
  readonly metrics?: Metrics
  /** Tests move the clock with this. @default the database's now() */
  readonly now?: () => Date | undefined
}

/**
 * The operators' admin: `/admin` (HTML, signed-in session, CSRF-checked forms)
 * and `/admin/api/...` (JSON, Bearer ADMIN_TOKEN). Every path under /admin is
 * handled here, so no admin URL can answer without passing the checks first.
 */
export function adminRoutes(options: AdminOptions) {
  const context: PageContext = {
    sql: options.pools.short,
    metrics: options.metrics,
    ttlSeconds: options.ttlSeconds ?? 30,
    retentionSeconds: options.retentionSeconds ?? 86_400,
    now: options.now,
    keys: new SessionKeys(options.adminToken),
  }

  async function admin(request: Request): Promise<AdminAnswer> {
    const url = new URL(request.url)
    const path = url.pathname.length > 1 ? url.pathname.replace(/\/+$/, '') : url.pathname
    const isApi = path === '/admin/api' || path.startsWith('/admin/api/')
    try {
      return isApi ? await handleApi(context, request, url, path) : await handlePage(context, request, url, path)
    } catch (error) {
      const unavailable = isUnavailable(error)
      if (!unavailable) console.error('admin:', error instanceof Error ? error.message : error)
      if (isApi) return unavailable ? problemResponse(problems.unavailable(), { 'retry-after': '2' }) : problemResponse(problems.internal())
      const message = unavailable ? 'The database is unavailable; try again in a few seconds.' : 'Something failed; see the server log. Nothing is known to have been done.'
      return htmlResponse(await MessagePage({ title: unavailable ? 'Database unavailable' : 'Error', message }), unavailable ? 503 : 500)
    }
  }

  // @elysiajs/html registers its hooks globally; kept inside this sub-app, they
  // never run on the payments API's requests.
  const pages = new Elysia({ name: 'admin-pages' }).use(html({ autoDetect: false }))
  const respond = async ({ request, html: render, set }: { request: Request; html: (value: string) => unknown; set: { status?: number | string; headers: Record<string, string | number> } }) => {
    const answer = await admin(request)
    if (!(answer instanceof RenderedPage)) return answer
    set.status = answer.status
    Object.assign(set.headers, answer.headers)
    return render(answer.html)
  }
  pages.all('/admin', respond, { parse: 'none' }).all('/admin/*', respond, { parse: 'none' })

  return new Elysia({ name: 'admin' })
    .all('/admin', ({ request }) => pages.handle(request), { parse: 'none' })
    .all('/admin/*', ({ request }) => pages.handle(request), { parse: 'none' })
}
