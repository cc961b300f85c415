/**
 * /admin: the HTML side. Sign-in is open (and throttled per address); every
 * other page needs an open session (sessions.ts; looked up before
 * validation, so nothing is looked at without it), and every POST must come
 * from our own origin with this session's CSRF token. Pages call
 * src/operations and render views/*.tsx.
 */
import { html } from '@elysiajs/html'
import { Elysia } from 'elysia'
import { ADMIN_PROBLEMS } from './problems'
import { timingSafeEqual } from 'node:crypto'
import { requestMeta } from '../http/client'
import { problem, problemResponse } from '../http/problem'
import { parseAuditFilters } from '../operations/audit'
import { parseKeyFilters } from '../operations/filters'
import { DEFAULT_PAGE_SIZE } from '../operations/list'
import { actingOps, type AdminDeps } from './api'
import { CrossSiteError, NotFoundError, SignedOutError } from './errors'
import { CONTENT_SECURITY_POLICY, type Operator } from './layout'
import { auditHref, backFilters, backOf, keyHref, listHref } from './links'
import { AuditEntryParams, AuditQuery, ConfirmExpireQuery, ConfirmExpireStaleQuery, CsrfForm, EndSessionForm, ExpireForm, ExpireStaleForm, KeyDetailQuery, KeyParams, KeyQuery, ListQuery, SessionsQuery, SignInForm, SignInQuery, ReleasedQuery, RunbookParams } from './schemas'
import { actorOf, readSessionCookie, sameOrigin, sessionCookie, validNote } from './session'
import { endSessionById, endSessionByToken, openSessions, startSession, useSession, type Session, type SessionSummary } from './sessions'
import { AuditEntryPage, AuditPage } from './views/audit'
import { ConfirmExpirePage, ConfirmExpireStalePage, ConfirmPurgePage } from './views/confirm'
import { KeyDetailPage } from './views/key-detail'
import { KeysPage } from './views/keys'
import { SignInPage } from './views/messages'
import { SessionsPage } from './views/sessions'
import { ReleasedPage, releasedHref } from './views/released'
import { RunbookIndexPage, RunbookPage } from './views/runbook'
import { runbooks } from './runbooks'
import { parseReleaseReason } from '../operations/released'
import { requestIdOf } from '../http/request-id'

/**
 * 30 s: one default TTL, so a key turning stale shows up within one TTL, and
 * a page left open on a wall screen costs the database one small indexed read
 * per 30 s. The list alone refreshes; detail and confirmation pages never do.
 */
export const AUTO_REFRESH_SECONDS = 30
const AUDIT_ON_KEYS_PAGE = 10
const AUDIT_PAGE_SIZE = 50

export const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  'content-security-policy': CONTENT_SECURITY_POLICY,
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  // same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on our own form posts.
  'referrer-policy': 'same-origin',
  'cache-control': 'no-store',
}

export function redirect(location: string, headers: Record<string, string> = {}): Response {
  return new Response(null, { status: 303, headers: { location, 'cache-control': 'no-store', ...headers } })
}

/** Secure cookies over TLS: our own https URL, or a trusted proxy's X-Forwarded-Proto (http/client.ts). */
const isHttps = (request: Request) => requestMeta(request).secure

/** The session a request was found to have (the error handler reads it instead of asking the database again). */
export const requestSessions = new WeakMap<Request, Session>()

/** Constant time, whatever the lengths. */
function isCsrf(session: Session, token: string | undefined): boolean {
  if (typeof token !== 'string') return false
  const digest = (text: string) => new Bun.CryptoHasher('sha256').update(text).digest()
  return timingSafeEqual(digest(token), digest(session.csrf))
}

/** The list page's own periodic reload (its meta refresh URL carries auto=1): not the operator's activity. */
const isAutoReload = (request: Request) => request.method === 'GET' && new URL(request.url).searchParams.get('auto') === '1'

/** A browser asks for HTML; a script sending the form by hand gets problem+json. */
const wantsHtml = (request: Request) => /\btext\/html\b/.test(request.headers.get('accept') ?? '')

/**
 * Where to go after signing in: a path of ours under /admin, never elsewhere.
 * Printable ASCII only: it becomes a Location header, which takes no other
 * byte (a `next` of `/admin/😀` broke the sign-in itself); a browser sends
 * such a path percent-encoded anyway.
 */
export function safeNext(next: string | undefined): string {
  return next && next.length <= 2048 && /^\/admin(?:[/?]|$)/.test(next) && /^[!-~]+$/.test(next) && !next.includes('\\') ? next : '/admin'
}

type ResponseSet = { headers: Record<string, string | number>; status?: number | string }

export function adminPages(deps: AdminDeps) {
  const { ops, auth, sql, now, log } = deps
  const page = (set: ResponseSet, extra: Record<string, string> = {}) => {
    Object.assign(set.headers, { 'content-type': 'text/html; charset=utf-8' }, SECURITY_HEADERS, extra)
  }
  const operatorOf = (session: Session): Operator => ({ name: session.operator, csrf: session.csrf })
  /** A session whose operator or token is no longer configured here is dead at once (operators.ts revocation). */
  const revokedHere = (session: SessionSummary) => auth.operators.revocation(session.operator, session.binding)
  const actor = (session: Session) => actorOf('admin', session.operator, session.note)
  const resultEntry = async (id: string | undefined) => (id ? ops.auditEntry(id) : undefined)

  const signIn = new Elysia({ prefix: '/admin' })
    .use(html({ autoDetect: false }))
    .get('/login', ({ html, set, query }) => {
      page(set)
      return html(SignInPage({ next: query.next ? safeNext(query.next) : undefined }) as string)
    }, { query: SignInQuery })
    .post('/login', async ({ html, set, body, request }) => {
      page(set)
      const next = safeNext(body.next)
      // Login CSRF: a foreign site must not sign a browser in under its own session either.
      if (!sameOrigin(request)) {
        set.status = 403
        return html(await SignInPage({ error: 'Sign-in refused: the form was not sent from this page.', next }))
      }
      const verdict = auth.check(request, body.token, 'form')
      if (verdict.kind === 'throttled') {
        const wait = verdict.retryAfterSeconds
        if (!wantsHtml(request)) return problemResponse({ ...ADMIN_PROBLEMS.problem('sign-in-throttled'), retryAfterSeconds: wait }, { 'cache-control': 'no-store' })
        set.status = 429
        set.headers['retry-after'] = String(wait)
        return html(await SignInPage({ error: `Too many wrong tokens from your address: try again in ${wait} s.`, next }))
      }
      if (verdict.kind !== 'ok') {
        set.status = 401
        return html(await SignInPage({ error: 'That is not an operator token.', next }))
      }
      const note = body.note?.trim()
      const { address, secure } = requestMeta(request)
      const { token, session } = await startSession(sql, { operator: verdict.operator, binding: auth.operators.bindingOf(verdict.operator)!, note: note && validNote(note) ? note : undefined, address }, now())
      log.info('admin signed in', { operator: session.operator, address, session: session.id, request_id: requestIdOf(request) })
      return redirect(next, { 'set-cookie': sessionCookie(token, secure) })
    }, { body: SignInForm })
    // The alert runbooks: public by design, and answered without the database. They are the "Alert
    // runbooks" section of docs/how-to/on-call.md, which ships with the product and holds no data, and the
    // moment they are needed most is when the database (where sessions live) is away: two alerts
    // fired at once used to open on a 503 (server.ts lets these through its database gate).
    .get('/runbooks', ({ html, set }) => {
      page(set)
      return html(RunbookIndexPage({ operator: undefined, runbooks: [...runbooks().values()] }) as string)
    })
    .get('/runbooks/:alert', ({ html, set, params }) => {
      const runbook = runbooks().get(params.alert)
      if (!runbook) {
        set.status = 404
        return html(RunbookIndexPage({ operator: undefined, runbooks: [...runbooks().values()], missing: params.alert }) as string)
      }
      page(set)
      return html(RunbookPage({ operator: undefined, runbook }) as string)
    }, { params: RunbookParams })

  const signedIn = new Elysia({ prefix: '/admin' })
    .use(html({ autoDetect: false }))
    // Before validation and the handler: without an open session nothing else is looked at;
    // a state-changing request from another origin is refused before its body is judged.
    .derive(async ({ request }) => {
      const session = await useSession(sql, readSessionCookie(request, isHttps(request)), revokedHere, now(), { renew: !isAutoReload(request) })
      if (!session) throw new SignedOutError()
      requestSessions.set(request, session)
      if (request.method !== 'GET' && request.method !== 'HEAD' && !sameOrigin(request)) throw new CrossSiteError()
      return { session, operator: operatorOf(session) }
    })
    .onBeforeHandle(({ request, body, session }) => {
      if (request.method === 'GET' || request.method === 'HEAD') return
      const csrf = (body as { csrf?: unknown } | undefined)?.csrf
      if (!isCsrf(session, typeof csrf === 'string' ? csrf : undefined)) throw new CrossSiteError()
    })

    .get('', async ({ html, set, query, operator }) => {
      const filters = parseKeyFilters(query)
      const paused = query.refresh === 'off'
      const started = performance.now()
      const [list, counts, audit, notice] = await Promise.all([
        ops.list(filters, { cursor: query.after || undefined, limit: DEFAULT_PAGE_SIZE }),
        ops.count(filters),
        ops.audit({ tenant: filters.tenant, limit: AUDIT_ON_KEYS_PAGE }),
        resultEntry(query.result),
      ])
      const queried = performance.now()
      const refresh = paused ? 'off' : undefined
      const body = await KeysPage({
        operator,
        counts,
        ttlSeconds: ops.ttlSeconds,
        filters,
        keys: list.keys,
        firstPage: !query.after,
        nextHref: list.nextCursor ? listHref(filters, { after: list.nextCursor, refresh }) : undefined,
        notice,
        audit: audit.entries,
        selfHref: listHref(filters, { after: query.after, refresh }),
        refreshSeconds: paused ? undefined : AUTO_REFRESH_SECONDS,
        held: deps.tenantsHeld?.() ?? [],
      })
      // Server-Timing: the browser's network panel (and the 100k-row measurement) see where the time goes.
      page(set, { 'server-timing': `db;dur=${(queried - started).toFixed(2)}, render;dur=${(performance.now() - queried).toFixed(2)}` })
      return html(body)
    }, { query: ListQuery })

    .get('/keys/:tenant/:key', ({ html, set, params, query, operator }) => detailPage(params.tenant, params.key, query, operator).then((body) => { page(set); return html(body) }), { params: KeyParams, query: KeyDetailQuery })
    .get('/key', ({ html, set, query, operator }) => detailPage(query.tenant, query.key, query, operator).then((body) => { page(set); return html(body) }), { query: KeyQuery })

    .get('/confirm/expire', async ({ html, set, query, operator }) => {
      const detail = await ops.show(query.tenant, query.key)
      if (!detail) throw new NotFoundError('No key with this tenant and key: it was purged, or never existed.')
      const back = backFilters(query.back)
      page(set)
      return html(await ConfirmExpirePage({ operator, detail, lease: query.lease, back: back ? backOf(back) : undefined }))
    }, { query: ConfirmExpireQuery })
    .get('/confirm/expire-stale', async ({ html, set, query, operator }) => {
      const preview = await ops.previewExpireStale(parseKeyFilters({ tenant: query.tenant }).tenant)
      page(set)
      return html(await ConfirmExpireStalePage({ operator, preview }))
    }, { query: ConfirmExpireStaleQuery })
    .get('/confirm/purge', async ({ html, set, operator }) => {
      const preview = await ops.previewPurge()
      page(set)
      return html(await ConfirmPurgePage({ operator, preview }))
    })

    // The deadline releases (the provider may have charged).
    .get('/released', async ({ html, set, query, operator }) => {
      const reason = parseReleaseReason(query.reason)
      const tenant = query.tenant?.trim() || undefined
      const [released, counts] = await Promise.all([ops.listReleased({ reason, tenant }, { cursor: query.cursor || undefined }), ops.countReleased(tenant)])
      page(set)
      return html(await ReleasedPage({ operator, reason, tenant, keys: released.keys, counts, nextHref: released.nextCursor ? releasedHref(reason, { tenant, cursor: released.nextCursor }) : undefined }))
    }, { query: ReleasedQuery })

    .get('/audit', async ({ html, set, query, operator }) => {
      const filters = parseAuditFilters(query)
      const result = await ops.audit({ ...filters, limit: AUDIT_PAGE_SIZE })
      page(set)
      return html(await AuditPage({ operator, entries: result.entries, filters, nextHref: result.nextBefore ? auditHref(filters, result.nextBefore) : undefined }))
    }, { query: AuditQuery })
    .get('/audit/:id', async ({ html, set, params, operator }) => {
      const entry = await ops.auditEntry(params.id)
      if (!entry) throw new NotFoundError('No audit entry with this id.')
      page(set)
      return html(await AuditEntryPage({ operator, entry }))
    }, { params: AuditEntryParams })

    .post('/keys/expire', async ({ body, session, request }) => {
      const result = await actingOps(deps, request).forceExpire({ tenant: body.tenant, key: body.key, lease: body.lease }, actor(session))
      const back = backFilters(body.back)
      return redirect(keyHref(body.tenant, body.key, { result: result.auditId, back: back ? backOf(back) : undefined }))
    }, { body: ExpireForm })
    .post('/expire-stale', async ({ body, session, request }) => {
      const tenant = parseKeyFilters({ tenant: body.tenant }).tenant
      const result = await actingOps(deps, request).expireStale({ asOf: new Date(body.as_of), tenant }, actor(session))
      return redirect(listHref({ tenant, staleOnly: false }, { result: result.auditId }))
    }, { body: ExpireStaleForm })
    .post('/purge', async ({ session, request }) => {
      const result = await actingOps(deps, request).purge(actor(session))
      return redirect(listHref({ staleOnly: false }, { result: result.auditId }))
    }, { body: CsrfForm })
    // Signing out ends the session on the server: its cookie, kept or copied, opens nothing any more.
    .post('/logout', async ({ request, session }) => {
      await endSessionByToken(sql, readSessionCookie(request, isHttps(request)) ?? '')
      log.info('admin signed out', { operator: session.operator, address: requestMeta(request).address, session: session.id, request_id: requestIdOf(request) })
      return redirect('/admin/login', { 'set-cookie': sessionCookie('', isHttps(request), 0) })
    }, { body: CsrfForm })

    .get('/sessions', async ({ html, set, query, operator, session }) => {
      const sessions = (await openSessions(sql, now())).map((open) => ({ ...open, revoked: auth.operators.revocation(open.operator, open.binding) }))
      page(set)
      return html(await SessionsPage({ operator, sessions, current: session.id, ended: query.ended }))
    }, { query: SessionsQuery })
    .post('/sessions/end', async ({ request, body, session }) => {
      const ended = await endSessionById(sql, body.id)
      log.info('admin session ended', { operator: ended?.operator, session: body.id, ended_by: session.operator, address: requestMeta(request).address, was_open: ended !== undefined })
      // Ending one's own session is signing out.
      if (body.id === session.id) return redirect('/admin/login', { 'set-cookie': sessionCookie('', isHttps(request), 0) })
      return redirect(`/admin/sessions?${new URLSearchParams({ ended: body.id })}`)
    }, { body: EndSessionForm })

  async function detailPage(tenant: string, key: string, query: { result?: string | undefined; back?: string | undefined }, operator: Operator): Promise<string> {
    const [detail, notice] = await Promise.all([ops.show(tenant, key), resultEntry(query.result)])
    if (!detail) throw new NotFoundError('No key with this tenant and key: it was purged, or never existed.')
    const back = backFilters(query.back)
    return KeyDetailPage({
      operator,
      detail,
      ttlSeconds: ops.ttlSeconds,
      retentionSeconds: ops.retentionSeconds,
      // Only the notice of an action on this very key.
      notice: notice && notice.tenant === tenant && notice.key === key ? notice : undefined,
      back,
      backQuery: back ? backOf(back) : undefined,
    }) as Promise<string>
  }

  return new Elysia({ name: 'admin-pages' }).use(signIn).use(signedIn)
}
