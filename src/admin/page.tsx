/** The HTML side of the admin: sign-in, the keys page, actions by POST form (no JavaScript). */
import { listAudit } from '../core/audit'
import { countKeys } from '../core/counts'
import { listProcessing } from '../core/list-processing'
import { expireStaleAction, forceExpireAction, type ActionContext } from './actions'
import { CONTENT_SECURITY_POLICY } from './layout'
import { AuditPage, ConfirmExpireStalePage, filtersQuery, KeysPage, MessagePage, SignInPage } from './pages'
import { decodeCursor, encodeCursor, parseFilters, validLease } from './query'
import { readCookie, sameOrigin, SESSION_COOKIE, sessionCookie, SessionKeys, validName, type Session } from './session'

/** Rows on one page: a screen and a half; the keyset makes deeper pages as cheap. */
const PAGE_SIZE = 50
const AUDIT_ON_KEYS_PAGE = 10
const AUDIT_PAGE_SIZE = 50
/** Admin forms carry a few short fields; anything bigger is not ours. */
const MAX_FORM_BYTES = 8 * 1024

export interface PageContext extends ActionContext {
  readonly keys: SessionKeys
}

const SECURITY_HEADERS = {
  'content-security-policy': CONTENT_SECURITY_POLICY,
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  // same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on our own form posts.
  'referrer-policy': 'same-origin',
  'cache-control': 'no-store',
}

/** A rendered page; routes.ts sends it through @elysiajs/html with the security headers. */
export class RenderedPage {
  readonly headers: Record<string, string>
  constructor(readonly html: string, readonly status: number, headers: Record<string, string>) {
    this.headers = { 'content-type': 'text/html; charset=utf-8', ...SECURITY_HEADERS, ...headers }
  }
}

/** What an admin handler answers: a page to render, or a plain Response (redirects). */
export type AdminAnswer = Response | RenderedPage

export function htmlResponse(html: string, status = 200, headers: Record<string, string> = {}): RenderedPage {
  return new RenderedPage(html, status, headers)
}

function redirect(location: string, headers: Record<string, string> = {}): Response {
  return new Response(null, { status: 303, headers: { location, 'cache-control': 'no-store', ...headers } })
}

async function readForm(request: Request): Promise<URLSearchParams | undefined> {
  const type = request.headers.get('content-type') ?? ''
  if (!/^application\/x-www-form-urlencoded\s*(;|$)/i.test(type)) return undefined
  const text = await request.text()
  return text.length > MAX_FORM_BYTES ? undefined : new URLSearchParams(text)
}

const isHttps = (request: Request) => new URL(request.url).protocol === 'https:'

/** Handles every /admin path that is not /admin/api. Unauthenticated requests see only the sign-in page. */
export async function handlePage(context: PageContext, request: Request, url: URL, path: string): Promise<AdminAnswer> {
  const method = request.method.toUpperCase()
  if (path === '/admin/login') {
    if (method === 'GET') return htmlResponse(await SignInPage({}))
    if (method === 'POST') return signIn(context, request)
  }
  const session = context.keys.verify(readCookie(request, SESSION_COOKIE))
  if (!session) {
    // No key data without a session: browsers go to the sign-in form.
    if (method === 'GET' || method === 'HEAD') return redirect('/admin/login')
    return htmlResponse(await MessagePage({ title: 'Signed out', message: 'Your session has ended. Sign in again.' }), 401)
  }
  const operator = { name: session.name, csrf: session.csrf }

  if (method === 'POST') {
    // CSRF: the request must come from our own pages (Origin / Sec-Fetch-Site) and carry this session's token.
    const form = await readForm(request)
    if (!sameOrigin(request) || !form || !context.keys.isCsrf(session, form.get('csrf')))
      return htmlResponse(await MessagePage({ title: 'Refused', message: 'This form did not come from this admin page (cross-site request or stale form). Nothing was done.', operator }), 403)
    if (path === '/admin/logout') return redirect('/admin/login', { 'set-cookie': sessionCookie('', isHttps(request), 0) })
    if (path === '/admin/keys/expire') return expireOne(context, session, form)
    if (path === '/admin/expire-stale') return expireAll(context, session, form)
  }
  if (method === 'GET' || method === 'HEAD') {
    if (path === '/admin') return keysPage(context, operator, url)
    if (path === '/admin/audit') return auditPage(context, operator, url)
    if (path === '/admin/expire-stale') return confirmPage(context, operator, url)
  }
  return htmlResponse(await MessagePage({ title: 'Not found', message: 'No such admin page.', operator }), 404)
}

async function signIn(context: PageContext, request: Request): Promise<AdminAnswer> {
  const form = await readForm(request)
  // Login CSRF: a foreign site must not sign a browser in under its own session either.
  if (!sameOrigin(request) || !form) return htmlResponse(await SignInPage({ error: 'Sign-in refused: the form was not sent from this page.' }), 403)
  const token = form.get('token') ?? ''
  if (!context.keys.isAdminToken(token)) return htmlResponse(await SignInPage({ error: 'That is not the admin token.' }), 401)
  const name = form.get('name')?.trim() || 'operator'
  const { cookie } = context.keys.issue(validName(name) ? name : 'operator')
  return redirect('/admin', { 'set-cookie': sessionCookie(cookie, isHttps(request)) })
}

async function keysPage(context: PageContext, operator: { name: string; csrf: string }, url: URL): Promise<AdminAnswer> {
  const filters = parseFilters(url.searchParams)
  if (!filters.ok) return htmlResponse(await MessagePage({ title: 'Bad filter', message: filters.error, operator }), 400)
  const rawCursor = url.searchParams.get('after')
  const after = rawCursor ? decodeCursor(rawCursor) : undefined
  if (rawCursor && !after) return htmlResponse(await MessagePage({ title: 'Bad page link', message: 'That page link is not one this page made.', operator }), 400)
  const resultId = url.searchParams.get('result')
  const now = context.now?.()
  const started = performance.now()
  const [page, counts, audit, notice] = await Promise.all([
    listProcessing(context.sql, { ttlSeconds: context.ttlSeconds, tenant: filters.value.tenant, method: filters.value.method, path: filters.value.path, staleOnly: filters.value.staleOnly, after, limit: PAGE_SIZE, now }),
    countKeys(context.sql, { ttlSeconds: context.ttlSeconds, retentionSeconds: context.retentionSeconds, now }),
    listAudit(context.sql, { limit: AUDIT_ON_KEYS_PAGE }),
    resultId && /^\d{1,18}$/.test(resultId) ? listAudit(context.sql, { id: resultId, limit: 1 }).then((rows) => rows[0]) : undefined,
  ])
  const queried = performance.now()
  const query = filtersQuery(filters.value)
  const nextHref = page.next ? `/admin${query}${query ? '&' : '?'}after=${encodeCursor(page.next)}` : undefined
  const html = await KeysPage({ operator, counts, ttlSeconds: context.ttlSeconds, filters: filters.value, keys: page.keys, firstPage: !after, nextHref, notice, audit })
  // Server-Timing: the browser's network panel (and the 100k-row measurement) see where the time goes.
  const timing = `db;dur=${(queried - started).toFixed(2)}, render;dur=${(performance.now() - queried).toFixed(2)}`
  return htmlResponse(html, 200, { 'server-timing': timing })
}

async function auditPage(context: PageContext, operator: { name: string; csrf: string }, url: URL): Promise<AdminAnswer> {
  const before = url.searchParams.get('before')
  if (before !== null && !/^\d{1,18}$/.test(before)) return htmlResponse(await MessagePage({ title: 'Bad page link', message: 'That page link is not one this page made.', operator }), 400)
  const entries = await listAudit(context.sql, { before: before ?? undefined, limit: AUDIT_PAGE_SIZE })
  const last = entries.at(-1)
  const nextHref = entries.length === AUDIT_PAGE_SIZE && last ? `/admin/audit?before=${last.id}` : undefined
  return htmlResponse(await AuditPage({ operator, entries, nextHref }))
}

async function confirmPage(context: PageContext, operator: { name: string; csrf: string }, url: URL): Promise<AdminAnswer> {
  const filters = parseFilters(url.searchParams)
  if (!filters.ok) return htmlResponse(await MessagePage({ title: 'Bad filter', message: filters.error, operator }), 400)
  const tenant = filters.value.tenant
  const [row] = await context.sql<{ as_of: Date; stale: number }[]>`
    with params as (select coalesce(${context.now?.() ?? null}::timestamptz, now()) as now)
    select p.now as as_of, (select count(*)::int from idempotency_keys k
       where k.status = 'processing' and k.locked_at <= p.now - make_interval(secs => ${context.ttlSeconds})
         ${tenant ? context.sql`and k.tenant = ${tenant}` : context.sql``}) as stale
      from params p`
  return htmlResponse(await ConfirmExpireStalePage({ operator, stale: row!.stale, asOf: row!.as_of, tenant, ttlSeconds: context.ttlSeconds }))
}

async function expireOne(context: PageContext, session: Session, form: URLSearchParams): Promise<AdminAnswer> {
  const tenant = form.get('tenant') ?? ''
  const key = form.get('key') ?? ''
  const lease = form.get('lease')
  if (!tenant || !key || tenant.length > 64 || key.length > 255 || !validLease(lease))
    return htmlResponse(await MessagePage({ title: 'Bad request', message: 'The form lacks a tenant, key or lease.', operator: session }), 400)
  const result = await forceExpireAction(context, { tenant, key, lease }, `admin:${session.name}`)
  return redirect(`/admin?result=${result.auditId}`)
}

async function expireAll(context: PageContext, session: Session, form: URLSearchParams): Promise<AdminAnswer> {
  const asOf = new Date(form.get('as_of') ?? '')
  if (Number.isNaN(asOf.getTime())) return htmlResponse(await MessagePage({ title: 'Bad request', message: 'The confirmation lacks its time.', operator: session }), 400)
  const tenant = form.get('tenant')?.trim() || undefined
  const result = await expireStaleAction(context, { asOf, tenant }, `admin:${session.name}`)
  return redirect(`/admin?result=${result.auditId}`)
}
