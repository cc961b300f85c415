/**
 * RFC 9457 problem details: every error answer of the service is one of the
 * codes below. One entry per code, one home: its status, its title and, where
 * a retry makes sense at a known pace, its `Retry-After`. The README lists
 * them (a test keeps the list in step), the OpenAPI document describes them,
 * and every caller (plugin, payments, server, admin) builds its answers here.
 */

import { Type, type TSchema } from '@sinclair/typebox'

export const PROBLEM_CONTENT_TYPE = 'application/problem+json'

/** The `type` URI of a problem: a stable name, not a page. */
export const problemType = (code: string): string => `urn:idempotent-post:problem:${code}`

export interface ProblemEntry {
  readonly status: number
  readonly title: string
  /** The detail when the caller gives none. */
  readonly detail: string
  /**
   * Seconds sent as `Retry-After`, when the problem has one. `in-progress`
   * sends the TTL its claim has left instead (at least 1), computed per answer.
   */
  readonly retryAfterSeconds?: number
}

/**
 * 2 s while the database is away: a restart or fail-over takes a few seconds,
 * and the health probe (store/health.ts) notices its return within one; a
 * shorter pace would only add load to a database that is coming back.
 */
const DATABASE_RETRY_AFTER_SECONDS = 2
/**
 * 1 s after a lost claim, a deadline or a shutdown: the key is already
 * released or owned by someone else, so the retry can run (or be answered
 * with the winner's result) at once; 1 is the smallest whole second.
 */
const AGAIN_RETRY_AFTER_SECONDS = 1

export const PROBLEMS = {
  // 400: the request itself is wrong; nothing was stored.
  'bad-request': { status: 400, title: 'Bad request', detail: 'The request could not be understood.' },
  'invalid-request': { status: 400, title: 'Bad request', detail: 'The request could not be read.' },
  'missing-idempotency-key': { status: 400, title: 'Missing Idempotency-Key', detail: 'Send an Idempotency-Key header.' },
  'invalid-idempotency-key': { status: 400, title: 'Invalid Idempotency-Key', detail: 'Idempotency-Key must be 1 to 255 printable ASCII characters (0x21 to 0x7E), sent once.' },
  'invalid-json': { status: 400, title: 'Invalid JSON body', detail: 'The body is not valid JSON.' },
  'invalid-body': { status: 400, title: 'Body outside the schema', detail: 'The body does not match the schema.' },
  'invalid-query': { status: 400, title: 'Invalid query', detail: 'The query parameters are not valid.' },
  // 401, 404, 413, 415
  'unauthorized': { status: 401, title: 'Missing or invalid credentials', detail: 'Send Authorization: Bearer <api key>.' },
  'not-found': { status: 404, title: 'Not found', detail: 'No such resource.' },
  'body-too-large': { status: 413, title: 'Request body too large', detail: 'The body is larger than this service accepts.' },
  'unsupported-media-type': { status: 415, title: 'Unsupported media type', detail: 'Send Content-Type: application/json.' },
  // 409, 422: the key's state decides.
  'in-progress': { status: 409, title: 'Request in progress', detail: 'A request with this Idempotency-Key is still being processed; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'lease-lost': { status: 409, title: 'Claim lost', detail: 'This request lost its claim on the key to a retry or an operator; its writes were rolled back. Retry to get the answer that counts.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'idempotency-key-reused': { status: 422, title: 'Idempotency-Key reused', detail: 'This Idempotency-Key was used for a different request (method, path or body).' },
  // 421, 429: refused before anything was looked at; nothing was stored. Retry-After per answer (http/rate-limit.ts, admin/throttle.ts).
  'host-not-allowed': { status: 421, title: 'Host not served', detail: 'This server does not answer for this Host (ALLOWED_HOSTS).' },
  'rate-limited': { status: 429, title: 'Too many requests', detail: 'This API key sent more requests than its rate allows; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'too-many-in-flight': { status: 429, title: 'Too many requests in processing', detail: 'This API key has as many requests in processing as this server takes at once; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'sign-in-throttled': { status: 429, title: 'Too many failed sign-ins', detail: 'Too many wrong admin tokens from this address; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  // Admin actions refused because of the key's state.
  'worker-alive': { status: 409, title: 'Worker alive', detail: 'A live worker holds this key and is still processing it; nothing was done.' },
  'key-changed': { status: 409, title: 'Key changed', detail: 'The key is no longer in processing under this lease (completed, released or taken over); nothing was done.' },
  // 5xx: the key was released (or becomes reclaimable after the TTL); a retry runs again.
  'internal': { status: 500, title: 'Internal error', detail: 'The request failed on our side; it may be retried.' },
  'provider-failed': { status: 502, title: 'Payment provider failed', detail: 'The payment provider failed or refused the charge.' },
  'provider-key-conflict': { status: 502, title: 'Payment provider key conflict', detail: 'The payment provider saw our idempotency key with other parameters.' },
  'database-unavailable': { status: 503, title: 'Service unavailable', detail: 'The database is unavailable; retry later with the same Idempotency-Key.', retryAfterSeconds: DATABASE_RETRY_AFTER_SECONDS },
  'shutting-down': { status: 503, title: 'Service restarting', detail: 'This server stopped before the request finished.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'not-ready': { status: 503, title: 'Not ready', detail: 'The database does not answer.', retryAfterSeconds: DATABASE_RETRY_AFTER_SECONDS },
  'metrics-unavailable': { status: 503, title: 'Metrics unavailable', detail: 'The workers\' metrics could not be collected; retry.' },
  'deadline-exceeded': { status: 504, title: 'Processing took too long', detail: 'Processing ran into its deadline and was stopped.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
} as const satisfies Record<string, ProblemEntry>

export type ProblemCode = keyof typeof PROBLEMS

export function isProblemCode(code: string): code is ProblemCode {
  return Object.hasOwn(PROBLEMS, code)
}

export interface Problem {
  /** A stable, machine-readable code; also the last part of `type`. */
  readonly code: ProblemCode
  readonly status: number
  readonly title: string
  readonly detail?: string
  /** Seconds for the `Retry-After` header; not part of the body. */
  readonly retryAfterSeconds?: number
  readonly [extension: string]: unknown
}

/**
 * The catalogue's problem `code`, with another detail or extension members
 * (`errors`, `audit_id`, ...) when given. `retryAfterSeconds` overrides the
 * catalogue's pace (in-progress: the TTL the claim has left).
 */
export function problem(code: ProblemCode, detail?: string, extensions: Readonly<Record<string, unknown>> = {}): Problem {
  const entry: ProblemEntry = PROBLEMS[code]
  return {
    code,
    status: entry.status,
    title: entry.title,
    detail: detail ?? entry.detail,
    ...(entry.retryAfterSeconds !== undefined ? { retryAfterSeconds: entry.retryAfterSeconds } : {}),
    ...extensions,
  }
}

export function problemBody(problem: Problem): string {
  const { code, status, title, detail, retryAfterSeconds: _, ...extensions } = problem
  return JSON.stringify({ type: problemType(code), title, status, ...(detail ? { detail } : {}), code, ...extensions })
}

/** The answer for `problem`: its status, problem+json, `Retry-After` when it has one, and `headers`. */
export function problemResponse(problem: Problem, headers: Record<string, string> = {}): Response {
  return new Response(problemBody(problem), {
    status: problem.status,
    headers: {
      'content-type': PROBLEM_CONTENT_TYPE,
      ...(problem.retryAfterSeconds !== undefined ? { 'retry-after': String(Math.max(1, Math.ceil(problem.retryAfterSeconds))) } : {}),
      ...headers,
    },
  })
}

/** Shorthands for the most used ones, kept for their callers. */
export const problems = {
  unauthorized: (detail?: string): Problem => problem('unauthorized', detail),
  notFound: (detail?: string): Problem => problem('not-found', detail),
  badRequest: (code: 'bad-request' | 'invalid-request' | 'missing-idempotency-key' | 'invalid-idempotency-key' | 'invalid-json' | 'invalid-body' | 'invalid-query', detail?: string, errors?: string[]): Problem =>
    problem(code, detail, errors ? { errors } : {}),
  unsupportedMediaType: (): Problem => problem('unsupported-media-type'),
  tooLarge: (limit: number): Problem => problem('body-too-large', `The body must be at most ${limit} bytes.`),
  unavailable: (detail?: string): Problem => problem('database-unavailable', detail),
  internal: (detail?: string): Problem => problem('internal', detail),
} as const

/** The codes of one status, in catalogue order. */
export function codesWithStatus(status: number): ProblemCode[] {
  return (Object.keys(PROBLEMS) as ProblemCode[]).filter((code) => PROBLEMS[code].status === status)
}

/**
 * The body of a problem answer as a schema (OpenAPI documents and tests):
 * `code` is one of `codes`, and `type` its URN. Extension members (`errors`,
 * `audit_id`, ...) are allowed, as RFC 9457 says.
 */
export function problemSchema(codes: readonly ProblemCode[]): TSchema {
  const statuses = [...new Set(codes.map((code) => PROBLEMS[code].status))]
  const literal = (values: string[]) => values.length === 1 ? Type.Literal(values[0]!) : Type.Union(values.map((value) => Type.Literal(value)))
  return Type.Object({
    type: literal(codes.map(problemType)),
    title: Type.String(),
    status: statuses.length === 1 ? Type.Literal(statuses[0]!) : Type.Integer({ minimum: 400, maximum: 599 }),
    detail: Type.Optional(Type.String()),
    code: literal([...codes]),
    errors: Type.Optional(Type.Array(Type.String(), { description: 'What is wrong with the body (invalid-body).' })),
    instance: Type.Optional(Type.String({ description: 'This occurrence: `urn:idempotent-post:request:<X-Request-Id>`, the id of the request it answered (a replay keeps its first request\'s).' })),
  }, { additionalProperties: true })
}
