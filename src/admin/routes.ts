/**
 * The operators' admin, routed with Elysia: `/admin` (HTML, a session kept in
 * the database, CSRF-checked forms; pages.ts) and `/admin/api/...` (JSON,
 * Bearer operator token; api.ts), both thin callers of src/operations.
 * Operators are named by their token (operators.ts); wrong tokens are
 * throttled per client address (auth.ts, throttle.ts).
 *
 * They live in an app of their own, which the service's app hands every
 * /admin request to: its parser, its error answers and @elysiajs/html's hooks
 * never touch the payments API, and the service's never touch the admin.
 * Every path under /admin is answered here, so no admin URL can answer
 * without passing the checks first.
 */
import type { TenantHeld } from '../http/tenant-refusals'
import { html } from '@elysiajs/html'
import { Elysia } from 'elysia'
import { ADMIN_PROBLEMS } from './problems'
import { isUnavailable } from '../core/errors'
import { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS } from '../core/policy'
import { problem, problemResponse, PROBLEMS } from '../http/problem'
import { errorText, log as defaultLog, type Logger } from '../log'
import { requestLogger } from '../http/request-id'
import type { Metrics } from '../metrics/registry'
import { operations, OperationInputError } from '../operations'
import type { Pools } from '../store/db'
import { adminApi } from './api'
import { AdminAuth } from './auth'
import { BadBodyError, BodyTooLargeError, MAX_ADMIN_BODY_BYTES, parseAdminBody, UnsupportedBodyError } from './body'
import { ApiUnauthorizedError, CrossSiteError, NotFoundError, SignedOutError, ThrottledError } from './errors'
import { credential, DEFAULT_OPERATOR, Operators, type OperatorCredential } from './operators'
import { adminPages, redirect, requestSessions, SECURITY_HEADERS } from './pages'
import { readSessionCookie } from './session'
import { requestMeta } from '../http/client'
import { useSession } from './sessions'
import { SignInThrottle } from '../http/throttle'
import { MessagePage } from './views/messages'

export interface AdminOptions {
  readonly pools: Pools
  /** Who may sign in (config.operators: ADMIN_TOKENS and ADMIN_TOKEN, hashed). Give this or `adminToken`. */
  readonly operators?: readonly OperatorCredential[]
  /** One operator, named "admin", with this token (tests, and apps of one operator). */
  readonly adminToken?: string
  /** The sign-in throttle; one per process, shared by every admin app of it. @default a new one */
  readonly throttle?: SignInThrottle
  /** @default the process's logger (src/log.ts) */
  readonly log?: Logger
  /** The server's TTL: past it a processing key is stale. @default DEFAULT_TTL_SECONDS */
  readonly ttlSeconds?: number
  /** The server's retention: past it a completed key is purged. @default DEFAULT_RETENTION_SECONDS */
  readonly retentionSeconds?: number
  readonly metrics?: Metrics
  /** Tests move the clock with this. @default the database's now() */
  readonly now?: () => Date | undefined
  /** The admin JSON API's OpenAPI document, served at /admin/api/openapi.json behind the API's credentials. @default none */
  readonly openApiDocument?: () => unknown
  /** Tenants this process refused at their limits within the last minute, for the list page. @default none known */
  readonly tenantsHeld?: () => readonly TenantHeld[]
}

/** The admin as an app of its own; `adminRoutes` mounts it. Tests may call `.handle()` on it directly. */
export function adminApp(options: AdminOptions) {
  const ops = operations({
    sql: options.pools.short,
    ttlSeconds: options.ttlSeconds ?? DEFAULT_TTL_SECONDS,
    retentionSeconds: options.retentionSeconds ?? DEFAULT_RETENTION_SECONDS,
    now: options.now,
    purgedKeys: options.metrics?.purgedKeys,
  })
  const credentials = options.operators ?? (options.adminToken ? [credential(DEFAULT_OPERATOR, options.adminToken)] : [])
  const log = options.log ?? defaultLog
  const auth = new AdminAuth(new Operators(credentials), options.throttle ?? new SignInThrottle(), log)
  const sql = options.pools.short
  const now = () => options.now?.()
  const deps = { ops, auth, sql, now, log, ...(options.openApiDocument ? { openApiDocument: options.openApiDocument } : {}), ...(options.tenantsHeld ? { tenantsHeld: options.tenantsHeld } : {}) }

  return new Elysia({ name: 'admin-app' })
    .use(html({ autoDetect: false }))
    // Every body, form or JSON, through one byte-bounded reader (body.ts), before any guard or handler.
    .onParse(({ request, contentType }) => parseAdminBody(request, contentType))
    .onError(async ({ code, error, request, path }) => {
      const cause = code === 'PARSE' && error instanceof Error && error.cause !== undefined ? error.cause : error
      const isApi = path === '/admin/api' || path.startsWith('/admin/api/')
      const refusal = classify(code, cause)
      if (refusal === 'internal') requestLogger(request, {}, log).error(`admin: ${errorText(cause)}`, { error: cause, route: isApi ? '/admin/api' : '/admin' })
      if (isApi) {
        // The same verdict the guard had (auth.bearer is once per request): a failure counts once.
        const verdict = auth.bearer(request)
        if (verdict.kind === 'throttled')
          return problemResponse({ ...ADMIN_PROBLEMS.problem('sign-in-throttled'), retryAfterSeconds: verdict.retryAfterSeconds })
        if (refusal === 'unauthorized' || verdict.kind !== 'ok')
          return problemResponse(problem('unauthorized', 'Send Authorization: Bearer <operator token> (ADMIN_TOKENS or ADMIN_TOKEN).'), { 'www-authenticate': 'Bearer realm="admin"' })
        return apiAnswer(refusal, cause)
      }
      // The session the guard found; else (an error before the guard ran: no such page, a body refused) looked up now.
      const session = requestSessions.get(request)
        ?? (refusal === 'signed-out' || refusal === 'unavailable' ? undefined : await useSession(sql, readSessionCookie(request, requestMeta(request).secure), (open) => auth.operators.revocation(open.operator, open.binding), now()).catch(() => undefined))
      // No page, not even a 404 or a bad-filter message, for someone without a session
      // (a database that is away is said as such: the session could not be looked up).
      if (refusal === 'signed-out' || (!session && refusal !== 'too-large' && refusal !== 'bad-body' && refusal !== 'unsupported' && refusal !== 'unavailable')) {
        if (request.method === 'GET' || request.method === 'HEAD') {
          const url = new URL(request.url)
          return redirect(`/admin/login?${new URLSearchParams({ next: `${url.pathname}${url.search}` })}`)
        }
        return pageAnswer(401, 'Signed out', 'Your session has ended. Sign in again.')
      }
      const operator = session ? { name: session.operator, csrf: session.csrf } : undefined
      const [status, title, message] = PAGE_ANSWERS[refusal === 'unauthorized' || refusal === 'throttled' ? 'internal' : refusal](cause)
      return pageAnswer(status, title, message, operator)
    })
    .use(adminApi(deps))
    .use(adminPages(deps))
}

type Refusal = 'unauthorized' | 'throttled' | 'signed-out' | 'cross-site' | 'not-found' | 'invalid' | 'bad-body' | 'too-large' | 'unsupported' | 'unavailable' | 'internal'

function classify(code: unknown, error: unknown): Refusal {
  if (error instanceof ApiUnauthorizedError) return 'unauthorized'
  if (error instanceof ThrottledError) return 'throttled'
  if (error instanceof SignedOutError) return 'signed-out'
  if (error instanceof CrossSiteError) return 'cross-site'
  if (error instanceof NotFoundError || code === 'NOT_FOUND') return 'not-found'
  if (error instanceof BodyTooLargeError) return 'too-large'
  if (error instanceof UnsupportedBodyError) return 'unsupported'
  if (error instanceof BadBodyError || code === 'PARSE') return 'bad-body'
  if (error instanceof OperationInputError || code === 'VALIDATION') return 'invalid'
  // A value the schema let through that PostgreSQL cannot hold (an id beyond bigint, a year 0): the request's, not ours.
  if (isValueOutOfRange(error)) return 'invalid'
  if (isUnavailable(error)) return 'unavailable'
  return 'internal'
}

/**
 * PostgreSQL's data exceptions for a value out of its type's range:
 * numeric_value_out_of_range (22003), datetime_field_overflow (22008),
 * invalid_datetime_format (22007). Statements of the admin take their values
 * from the request, so these are answered as a malformed field, never a 500.
 */
const OUT_OF_RANGE = new Set(['22003', '22007', '22008'])
function isValueOutOfRange(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code
  return typeof code === 'string' && OUT_OF_RANGE.has(code)
}

/** The field a TypeBox validation failure names, for a message an operator can act on. */
function invalidField(error: unknown): string {
  if (error instanceof OperationInputError) return error.message
  if (isValueOutOfRange(error)) return 'a value of this request is out of range'
  const property = (error as { valueError?: { path?: string } }).valueError?.path?.replace(/^\//, '')
  return property ? `${property} is malformed` : 'a field of this request is malformed'
}

function apiAnswer(refusal: Refusal, error: unknown): Response {
  switch (refusal) {
    case 'not-found': return problemResponse(problem('not-found', error instanceof NotFoundError ? error.message : 'No such admin API endpoint.'))
    case 'invalid': return problemResponse(problem('invalid-query', `${invalidField(error)}.`))
    case 'bad-body': return problemResponse(problem('invalid-json', error instanceof Error ? `${error.message}.` : undefined))
    // Connection: close: the rest of the body is never read, so this connection cannot carry another request.
    case 'too-large': return problemResponse(problem('body-too-large', `The body must be at most ${MAX_ADMIN_BODY_BYTES} bytes.`), { connection: 'close' })
    case 'unsupported': return problemResponse(problem('unsupported-media-type', 'Send Content-Type: application/json.'))
    case 'unavailable': return problemResponse(problem('database-unavailable'))
    default: return problemResponse(problem('internal'))
  }
}

const PAGE_ANSWERS: Record<Exclude<Refusal, 'unauthorized' | 'throttled' | 'signed-out'>, (error: unknown) => [status: number, title: string, message: string]> = {
  'cross-site': (error) => [403, 'Refused', (error as Error).message],
  'not-found': (error) => [404, 'Not found', error instanceof NotFoundError ? error.message : 'No such admin page.'],
  'invalid': (error) => [400, 'Bad request', `${invalidField(error)}.`],
  'bad-body': () => [400, 'Bad request', 'The form could not be read.'],
  'too-large': () => [413, 'Too large', `A form is at most ${MAX_ADMIN_BODY_BYTES} bytes.`],
  'unsupported': () => [415, 'Unsupported', 'Send the form as application/x-www-form-urlencoded.'],
  'unavailable': () => [503, 'Database unavailable', 'The database is unavailable; try again in a few seconds.'],
  'internal': () => [500, 'Error', 'Something failed; see the server log. Nothing is known to have been done.'],
}

async function pageAnswer(status: number, title: string, message: string, operator?: { name: string; csrf: string }): Promise<Response> {
  return new Response(await MessagePage({ title, message, operator }), {
    status,
    headers: {
      'content-type': 'text/html; charset=utf-8',
      ...SECURITY_HEADERS,
      ...(status === 503 ? { 'retry-after': String(PROBLEMS['database-unavailable'].retryAfterSeconds) } : {}),
      ...(status === 413 ? { connection: 'close' } : {}),
    },
  })
}

/** Mounts the admin on the service's app: every /admin path goes to adminApp, its body unread; no answer of it is cached. */
export function adminRoutes(options: AdminOptions) {
  const app = adminApp(options)
  const forward = async ({ request }: { request: Request }) => {
    const response = await app.handle(request)
    response.headers.set('cache-control', 'no-store')
    return response
  }
  return new Elysia({ name: 'admin' })
    .all('/admin', forward, { parse: 'none' })
    .all('/admin/*', forward, { parse: 'none' })
}
