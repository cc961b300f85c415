/**
 * RFC 9457 problem details: every error answer is a code of a catalogue.
 * One entry per code, one home: its status, its title, its `type` URI and,
 * where a retry makes sense at a known pace, its `Retry-After`.
 *
 * The catalogue is open: the plugin's own codes are below (`PROBLEMS`, the
 * answers any idempotent route gives), and an app or a route defines its
 * own with `defineProblems` (the payments service in payments/problems.ts,
 * the admin in admin/problems.ts, examples/orders its "out of stock"),
 * merged with `.with()` where one app answers with several. A code defined
 * twice with different entries is refused when merged, so one code never
 * means two things in one app. docs/reference/http-api.md lists the service's codes (a test
 * keeps the list in step with SERVICE_PROBLEMS, src/problems.ts).
 */
import { Type, type TSchema } from '@sinclair/typebox'

export const PROBLEM_CONTENT_TYPE = 'application/problem+json'

/** The `type` URIs of this package's codes: `urn:idempotent-post:problem:<code>`, a stable name, not a page. */
export const PROBLEM_TYPE_PREFIX = 'urn:idempotent-post:problem:'

/** The `type` URI of one of this package's codes. */
export const problemType = (code: string): string => `${PROBLEM_TYPE_PREFIX}${code}`

export interface ProblemEntry {
  readonly status: number
  readonly title: string
  /** The detail when the caller gives none. */
  readonly detail: string
  /** The `type` URI; @default the catalogue's prefix followed by the code. */
  readonly type?: string
  /**
   * Seconds sent as `Retry-After`, when the problem has one. `in-progress`
   * sends the age-based wait of its claim instead (at least 1), computed per answer.
   */
  readonly retryAfterSeconds?: number
}

/** A problem code: lower-case words joined by hyphens (it is also the last part of the default `type`). */
const CODE = /^[a-z][a-z0-9]*(-[a-z0-9]+)*$/

/** Codes, their entries, and the problems made from them. */
export interface ProblemCatalogue<Code extends string> {
  readonly entries: { readonly [C in Code]: ProblemEntry }
  /** In definition order (merged catalogues: the first one's codes first). */
  readonly codes: readonly Code[]
  has(code: string): code is Code
  /** The `type` URI of `code`. */
  type(code: Code): string
  /**
   * The problem `code`, with another detail or extension members (`errors`,
   * `audit_id`, ...) when given. `retryAfterSeconds` in `extensions` overrides
   * the entry's pace.
   */
  problem(code: Code, detail?: string, extensions?: Readonly<Record<string, unknown>>): Problem
  /** This catalogue and `other`; refuses a code both define differently. */
  with<Other extends string>(other: ProblemCatalogue<Other>): ProblemCatalogue<Code | Other>
}

export interface CatalogueOptions {
  /** Prefix of the default `type` of each code. @default 'urn:idempotent-post:problem:' */
  readonly typePrefix?: string
}

/**
 * A catalogue of your own codes, e.g. for a route's business refusals:
 *
 *   const ORDER_PROBLEMS = defineProblems({
 *     'out-of-stock': { status: 422, title: 'Out of stock', detail: 'Not enough stock for this order.' },
 *   }, { typePrefix: 'urn:orders:problem:' })
 *   return problemResult(ORDER_PROBLEMS.problem('out-of-stock'))   // in a route's record step
 */
export function defineProblems<const Entries extends Readonly<Record<string, ProblemEntry>>>(
  entries: Entries,
  options: CatalogueOptions = {},
): ProblemCatalogue<keyof Entries & string> {
  const prefix = options.typePrefix ?? PROBLEM_TYPE_PREFIX
  const resolved: Record<string, ProblemEntry & { type: string }> = {}
  for (const [code, entry] of Object.entries(entries)) {
    if (!CODE.test(code)) throw new TypeError(`problem code ${JSON.stringify(code)}: use lower-case words joined by hyphens`)
    if (!(Number.isInteger(entry.status) && entry.status >= 400 && entry.status <= 599)) throw new TypeError(`problem ${code}: status must be 400..599, got ${entry.status}`)
    resolved[code] = { ...entry, type: entry.type ?? `${prefix}${code}` }
  }
  return catalogue(resolved) as ProblemCatalogue<keyof Entries & string>
}

const sameEntry = (a: ProblemEntry, b: ProblemEntry): boolean =>
  a.status === b.status && a.title === b.title && a.detail === b.detail && a.type === b.type && a.retryAfterSeconds === b.retryAfterSeconds

function catalogue(entries: Readonly<Record<string, ProblemEntry & { type: string }>>): ProblemCatalogue<string> {
  const frozen = Object.freeze({ ...entries })
  const has = (code: string): code is string => Object.hasOwn(frozen, code)
  return Object.freeze({
    entries: frozen,
    codes: Object.freeze(Object.keys(frozen)),
    has,
    type: (code: string) => frozen[code]!.type,
    problem(code: string, detail?: string, extensions: Readonly<Record<string, unknown>> = {}): Problem {
      const entry = frozen[code]
      if (!entry) throw new TypeError(`no problem code ${JSON.stringify(code)} in this catalogue`)
      return {
        type: entry.type,
        code,
        status: entry.status,
        title: entry.title,
        detail: detail ?? entry.detail,
        ...(entry.retryAfterSeconds !== undefined ? { retryAfterSeconds: entry.retryAfterSeconds } : {}),
        ...extensions,
      }
    },
    with(other: ProblemCatalogue<string>): ProblemCatalogue<string> {
      const merged: Record<string, ProblemEntry & { type: string }> = { ...frozen }
      for (const code of other.codes) {
        const entry = { ...other.entries[code]!, type: other.type(code) }
        const mine = merged[code]
        if (mine && !sameEntry(mine, entry))
          throw new TypeError(`problem code ${JSON.stringify(code)} is defined twice, differently (${mine.status} ${mine.title} / ${entry.status} ${entry.title})`)
        merged[code] = entry
      }
      return catalogue(merged)
    },
  })
}

/**
 * 2 s while the database is away: a restart or fail-over takes a few seconds,
 * and the health probe (store/health.ts) notices its return within one; a
 * shorter pace would only add load to a database that is coming back.
 */
export const DATABASE_RETRY_AFTER_SECONDS = 2
/**
 * 1 s after a lost claim, a deadline or a shutdown: the key is already
 * released or owned by someone else, so the retry can run (or be answered
 * with the winner's result) at once; 1 is the smallest whole second.
 */
export const AGAIN_RETRY_AFTER_SECONDS = 1

/** The plugin's own codes: what any idempotent route, and any HTTP app built on the plugin, answers with. */
export const PLUGIN_PROBLEMS = defineProblems({
  // 400: the request itself is wrong; nothing was stored.
  'bad-request': { status: 400, title: 'Bad request', detail: 'The request could not be understood.' },
  'invalid-request': { status: 400, title: 'Bad request', detail: 'The request could not be read.' },
  'missing-idempotency-key': { status: 400, title: 'Missing Idempotency-Key', detail: 'Send an Idempotency-Key header.' },
  'invalid-idempotency-key': { status: 400, title: 'Invalid Idempotency-Key', detail: 'Idempotency-Key must be 1 to 255 printable ASCII characters (0x21 to 0x7E), bare or as an RFC 8941 sf-string ("..."), sent once.' },
  'invalid-json': { status: 400, title: 'Invalid JSON body', detail: 'The body is not valid JSON.' },
  'invalid-body': { status: 400, title: 'Body outside the schema', detail: 'The body does not match the schema.' },
  'invalid-query': { status: 400, title: 'Invalid query', detail: 'The query parameters are not valid.' },
  // 401, 404, 405, 413, 415
  'unauthorized': { status: 401, title: 'Missing or invalid credentials', detail: 'Send Authorization: Bearer <api key>.' },
  'not-found': { status: 404, title: 'Not found', detail: 'No such resource.' },
  'method-not-allowed': { status: 405, title: 'Method not allowed', detail: 'This path does not serve this method; Allow lists the ones it does.' },
  'body-too-large': { status: 413, title: 'Request body too large', detail: 'The body is larger than this service accepts.' },
  'unsupported-media-type': { status: 415, title: 'Unsupported media type', detail: 'Send Content-Type: application/json.' },
  // 409, 422: the key's state decides.
  'in-progress': { status: 409, title: 'Request in progress', detail: 'A request with this Idempotency-Key is still being processed; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'lease-lost': { status: 409, title: 'Claim lost', detail: 'This request lost its claim on the key to a retry or an operator; its writes were rolled back. Retry to get the answer that counts.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'idempotency-key-reused': { status: 422, title: 'Idempotency-Key reused', detail: 'This Idempotency-Key was used for a different request (method, path or body).' },
  // 5xx: the key was released (or becomes reclaimable after the TTL); a retry runs again.
  'internal': { status: 500, title: 'Internal error', detail: 'The request failed on our side; it may be retried.' },
  'database-unavailable': { status: 503, title: 'Service unavailable', detail: 'The database is unavailable; retry later with the same Idempotency-Key.', retryAfterSeconds: DATABASE_RETRY_AFTER_SECONDS },
  'shutting-down': { status: 503, title: 'Service restarting', detail: 'This server stopped before the request finished.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'deadline-exceeded': { status: 504, title: 'Processing took too long', detail: 'Processing ran into its deadline and was stopped.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
})

/** The plugin's codes and their entries. */
export const PROBLEMS = PLUGIN_PROBLEMS.entries

export type ProblemCode = (typeof PLUGIN_PROBLEMS.codes)[number]

export function isProblemCode(code: string): code is ProblemCode {
  return PLUGIN_PROBLEMS.has(code)
}

export interface Problem {
  /** The `type` URI: names the problem; a client switches on it (or on `code`). */
  readonly type: string
  /** A stable, machine-readable code; by default also the last part of `type`. */
  readonly code: string
  readonly status: number
  readonly title: string
  readonly detail?: string
  /** RFC 9457 `instance`: a URI naming this occurrence (e.g. the request's id); omitted when unset. */
  readonly instance?: string
  /** Seconds for the `Retry-After` header; not part of the body. */
  readonly retryAfterSeconds?: number
  readonly [extension: string]: unknown
}

/** One of the plugin's problems (see `ProblemCatalogue.problem`). */
export function problem(code: ProblemCode, detail?: string, extensions: Readonly<Record<string, unknown>> = {}): Problem {
  return PLUGIN_PROBLEMS.problem(code, detail, extensions)
}

/** The JSON members of `problem`, in RFC 9457's order, then `code` and the extensions. */
export function problemJson(problem: Problem): Record<string, unknown> {
  const { type, code, status, title, detail, instance, retryAfterSeconds: _, ...extensions } = problem
  return { type, title, status, ...(detail ? { detail } : {}), ...(instance ? { instance } : {}), code, ...extensions }
}

export function problemBody(problem: Problem): string {
  return JSON.stringify(problemJson(problem))
}

/** The headers a problem answer carries besides its content type: `Retry-After` when it has one. */
export function problemHeaders(problem: Problem): Record<string, string> {
  return problem.retryAfterSeconds !== undefined ? { 'retry-after': String(Math.max(1, Math.ceil(problem.retryAfterSeconds))) } : {}
}

/** The answer for `problem`: its status, problem+json, `Retry-After` when it has one, and `headers`. */
export function problemResponse(problem: Problem, headers: Record<string, string> = {}): Response {
  return new Response(problemBody(problem), {
    status: problem.status,
    headers: { 'content-type': PROBLEM_CONTENT_TYPE, ...problemHeaders(problem), ...headers },
  })
}

/**
 * `problem` as what an idempotent route's record step returns: a 4xx is a
 * business refusal, stored and replayed like a success (its Retry-After
 * too); a 5xx rolls the writes back and releases the key.
 */
export function problemResult(problem: Problem, headers: Record<string, string> = {}): { status: number; body: Record<string, unknown>; headers: Record<string, string> } {
  return { status: problem.status, body: problemJson(problem), headers: { ...problemHeaders(problem), ...headers } }
}

/**
 * Thrown from a route's external step (`act`) to answer with this problem:
 * the key is released (nothing was recorded), so a retry runs again. For a
 * refusal that must be replayed, return `problemResult` from `record` instead.
 */
export class ProblemError extends Error {
  constructor(readonly problem: Problem, options?: ErrorOptions) {
    super(problem.detail ?? problem.title, options)
    this.name = 'ProblemError'
  }
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
export function codesWithStatus<Code extends string = ProblemCode>(status: number, catalogue: ProblemCatalogue<Code> = PLUGIN_PROBLEMS as unknown as ProblemCatalogue<Code>): Code[] {
  return catalogue.codes.filter((code) => catalogue.entries[code].status === status)
}

/**
 * Any problem answer's body (RFC 9457 and our `code`): one named schema, so
 * a client generated from the OpenAPI document gets one Problem type.
 */
export const ProblemDetails = Type.Object({
  type: Type.String({ description: 'A URI naming the problem, e.g. `urn:idempotent-post:problem:in-progress`.' }),
  title: Type.String(),
  status: Type.Integer({ minimum: 400, maximum: 599 }),
  detail: Type.Optional(Type.String()),
  instance: Type.Optional(Type.String({ description: 'A URI naming this occurrence.' })),
  code: Type.String({ description: 'Stable and machine-readable: the last part of `type`.' }),
  errors: Type.Optional(Type.Array(Type.String(), { description: 'What is wrong with the body (invalid-body).' })),
}, { additionalProperties: true, title: 'Problem' })

/**
 * The body of a problem answer whose `code` is one of `codes` (OpenAPI
 * documents and tests): a Problem whose `type`, `code` and `status` are
 * narrowed to these codes'. Extension members (`errors`, `audit_id`, ...)
 * are allowed, as RFC 9457 says.
 */
export function problemSchema<Code extends string = ProblemCode>(codes: readonly Code[], catalogue: ProblemCatalogue<Code> = PLUGIN_PROBLEMS as unknown as ProblemCatalogue<Code>): TSchema {
  const statuses = [...new Set(codes.map((code) => catalogue.entries[code].status))]
  const one = (values: readonly (string | number)[]) => values.length === 1 ? { const: values[0] } : { enum: [...values] }
  return {
    allOf: [ProblemDetails, {
      type: 'object',
      properties: { type: one(codes.map((code) => catalogue.type(code))), status: one(statuses), code: one(codes) },
    }],
  } as unknown as TSchema
}
