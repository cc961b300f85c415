/**
 * Request ids, end to end (SPEC: every answer carries `X-Request-Id`, the
 * client's when it sent a sane one; also in the problem's `instance` and in
 * every log line about the request).
 *
 * The id is decided once, at the edge (`withRequestIds`, wrapped around the
 * whole app by server.ts), and kept with the Request object: every layer
 * below (the idempotency plugin, the admin, the server's error handler) asks
 * `requestLogger(request)` for a logger bound to it, and the edge stamps the
 * answer. An answer that failed (5xx) and that no layer logged gets one line
 * from the edge, so no failure is silent (a 503 while the database is away,
 * an error no handler expected).
 */
import { log as processLog, type LogFields, type Logger } from '../log'
import { PROBLEM_CONTENT_TYPE } from './problem'
import { pathnameOf } from './client'

export const REQUEST_ID_HEADER = 'x-request-id'

/**
 * What we take from a client: 1 to 128 characters of letters, digits and
 * `. _ ~ : @ / + = -`. That covers UUIDs, ULIDs, W3C trace ids and the
 * `Root=1-…` ids of AWS load balancers, all of which are valid in a URN (the
 * problem's `instance`). Anything else (spaces, quotes, control or non-ASCII
 * characters, longer values) is replaced by one of ours rather than cleaned:
 * a cleaned id would no longer match what the client logged.
 */
const SANE_ID = /^[A-Za-z0-9._~:@/+=-]{1,128}$/

/** The client's id if it is sane, else undefined. */
export function acceptRequestId(raw: string | null | undefined): string | undefined {
  return raw !== null && raw !== undefined && SANE_ID.test(raw) ? raw : undefined
}

/** UUIDv7: unique, and sorted by time, so ids of one incident sit together in a log index. */
export function newRequestId(): string {
  return Bun.randomUUIDv7()
}

/** The problem's `instance`: a URN naming this occurrence (RFC 9457 §3.1.5), in the style of its `type`. */
export function problemInstance(requestId: string): string {
  return `urn:idempotent-post:request:${requestId}`
}

interface RequestContext {
  readonly id: string
  /** Decided by withRequestIds, which stamps the answer on its way out; else the plugin stamps its own. */
  readonly edge?: boolean
  /** Set once a line about this request was written at info level or above. */
  logged: boolean
  /** The id the client sent, when it was refused (logged escaped with the edge's line). */
  readonly refused?: string
}

const contexts = new WeakMap<Request, RequestContext>()

function contextOf(request: Request): RequestContext {
  let context = contexts.get(request)
  if (!context) {
    // Not through the edge (the plugin mounted in another app): the client's id, or a new one.
    context = { id: acceptRequestId(request.headers.get(REQUEST_ID_HEADER)) ?? newRequestId(), logged: false }
    contexts.set(request, context)
  }
  return context
}

/**
 * `response` with this request's id (`X-Request-Id`, and a problem's
 * `instance`), unless withRequestIds will stamp it on its way out: the
 * plugin mounted in an app of its own answers with the id of its log lines
 * as the service does.
 */
export function stampedByPlugin(request: Request, response: Response): Response | Promise<Response> {
  const context = contextOf(request)
  // Through the service's edge (every request there): the answer as it is, with no extra await on the hot path.
  return context.edge ? response : stamped(response, context.id).then((done) => done.response)
}

/** This request's id. */
export function requestIdOf(request: Request): string {
  return contextOf(request).id
}

/** A logger whose lines carry this request's id (and `fields`); writing a line marks the request as logged. */
export function requestLogger(request: Request, fields: LogFields = {}, base: Logger = processLog): Logger {
  const context = contextOf(request)
  const refused = context.refused !== undefined ? { refused_request_id: context.refused } : {}
  return marking(base.child({ request_id: context.id, ...refused, ...fields }), context)
}

function marking(logger: Logger, context: RequestContext): Logger {
  return {
    debug: (msg, fields) => logger.debug(msg, fields),
    info: (msg, fields) => { context.logged = true; logger.info(msg, fields) },
    warn: (msg, fields) => { context.logged = true; logger.warn(msg, fields) },
    error: (msg, fields) => { context.logged = true; logger.error(msg, fields) },
    child: (fields) => marking(logger.child(fields), context),
  }
}

export interface RequestIdOptions {
  /** The route template of a path, for the edge's own line (never the client's path). */
  readonly routeOf: (pathname: string) => string
  /** @default the process logger */
  readonly log?: Logger | undefined
}

/**
 * Wraps the app's fetch: decides the request's id, and on the way out puts
 * it in `X-Request-Id` and, for a problem answer without one, in the body's
 * `instance`. A stored problem the plugin replays already has its first
 * request's `instance` (http/idempotency.ts stores it), so a replay stays
 * byte for byte the first answer; its header names the retry.
 */
export function withRequestIds(fetch: (request: Request) => Promise<Response>, options: RequestIdOptions) {
  const log = options.log ?? processLog
  return async function requestIdFetch(request: Request): Promise<Response> {
    const started = performance.now()
    const sent = request.headers.get(REQUEST_ID_HEADER)
    const accepted = acceptRequestId(sent)
    const context: RequestContext = { id: accepted ?? newRequestId(), logged: false, edge: true, ...(sent !== null && !accepted ? { refused: sent } : {}) }
    contexts.set(request, context)
    const { response, code } = await stamped(await fetch(request), context.id)
    if (response.status >= 500 && !context.logged) {
      // The one line for a failure no layer described (e.g. a 503 while the database is known to be away).
      log[response.status === 500 ? 'error' : 'warn']('request failed', {
        request_id: context.id,
        method: request.method,
        route: options.routeOf(pathnameOf(request)),
        status: response.status,
        code,
        duration_ms: Math.round(performance.now() - started),
        ...(context.refused !== undefined ? { refused_request_id: context.refused } : {}),
      })
    }
    return response
  }
}

/**
 * The answer with its id. A problem body is rewritten only to add
 * `"instance"` before its closing brace (problem bodies are small, and only
 * error answers pay this); its `code` is returned for the edge's line.
 */
async function stamped(response: Response, id: string): Promise<{ response: Response; code?: string }> {
  if (!(response.headers.get('content-type') ?? '').startsWith(PROBLEM_CONTENT_TYPE)) return { response: withHeader(response, id) }
  const text = await response.text()
  const body = text.endsWith('}') && !text.includes('"instance":') ? `${text.slice(0, -1)}${text === '{}' ? '' : ','}"instance":${JSON.stringify(problemInstance(id))}}` : text
  const headers = new Headers(response.headers)
  headers.delete('content-length')
  headers.set(REQUEST_ID_HEADER, id)
  const code = /"code":"([a-z0-9-]{1,64})"/.exec(text)?.[1]
  return { response: new Response(body, { status: response.status, statusText: response.statusText, headers }), ...(code ? { code } : {}) }
}

function withHeader(response: Response, id: string): Response {
  try {
    response.headers.set(REQUEST_ID_HEADER, id)
    return response
  } catch {
    // Immutable headers (a fetched Response passed through): copy them.
    const headers = new Headers(response.headers)
    headers.set(REQUEST_ID_HEADER, id)
    return new Response(response.body, { status: response.status, statusText: response.statusText, headers })
  }
}
