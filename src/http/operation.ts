/**
 * The OpenAPI operation of an idempotent route, built from the same schemas
 * and catalogue the plugin checks and answers with, so the document cannot
 * drift from what the route does. Elysia's OpenAPI plugin picks it up from the
 * route's `detail` (the route keeps parse: 'none' and its own body reader:
 * declaring `body`/`headers` hooks would make Elysia parse and validate too).
 */
import { Type, type TSchema } from '@sinclair/typebox'
import type { DocumentDecoration } from 'elysia'
import { PROBLEM_CONTENT_TYPE, PROBLEMS, problemSchema, type ProblemCode } from './problem'

/** Printable ASCII without space, 1..255 characters (SPEC: Idempotency-Key). The plugin checks keys with this pattern. */
export const IdempotencyKey = Type.String({
  pattern: '^[!-~]{1,255}$',
  minLength: 1,
  maxLength: 255,
  description: 'Chosen by the client, one per logical request, sent again unchanged on every retry of it. Scoped by tenant.',
  examples: ['order-7f3c2a-payment'],
})

/** OpenAPI 3.1 response object (the parts we use). */
export interface ResponseDoc {
  readonly description: string
  readonly headers?: Readonly<Record<string, unknown>>
  readonly content?: Readonly<Record<string, { readonly schema: unknown }>>
}

/** What a route adds to its operation: its own answers (the 2xx, business refusals, extra 5xx) and words. */
export interface RouteDocs {
  readonly summary?: string
  readonly description?: string
  readonly tags?: readonly string[]
  readonly operationId?: string
  /** By status, e.g. `{ 201: { description, headers, content } }`. */
  readonly responses?: Readonly<Record<string, ResponseDoc>>
}

const header = (description: string, schema: unknown, required = false) => ({ description, required, schema })

const RETRY_AFTER = header('Whole seconds to wait before retrying with the same Idempotency-Key.', Type.Integer({ minimum: 1 }), true)
const REPLAYED = header('`true` when this is the stored answer of an earlier request with the same key, replayed byte for byte.', Type.Literal('true'))

/** A problem+json answer whose `code` is one of `codes` (all of one status). */
export function problemAnswer(codes: readonly ProblemCode[], description?: string, headers: Record<string, unknown> = {}): ResponseDoc {
  const retryAfter = codes.some((code) => 'retryAfterSeconds' in PROBLEMS[code])
  const allRetry = codes.every((code) => 'retryAfterSeconds' in PROBLEMS[code])
  return {
    description: description ?? codes.map((code) => `\`${code}\`: ${PROBLEMS[code].title}.`).join(' '),
    ...(retryAfter || Object.keys(headers).length
      ? { headers: { ...(retryAfter ? { 'Retry-After': { ...RETRY_AFTER, required: allRetry } } : {}), ...headers } }
      : {}),
    content: { [PROBLEM_CONTENT_TYPE]: { schema: problemSchema(codes) } },
  }
}

/** An OpenAPI 3.1 operation object (the parts we use). */
export interface OperationDoc {
  readonly summary?: string
  readonly description?: string
  readonly tags?: readonly string[]
  readonly operationId?: string
  readonly security?: readonly Record<string, readonly string[]>[]
  readonly parameters?: readonly { name: string; in: 'query' | 'header' | 'path' | 'cookie'; required: boolean; schema: unknown; description?: string }[]
  readonly requestBody?: { readonly required: boolean; readonly description?: string; readonly content: Readonly<Record<string, { readonly schema: unknown }>> }
  readonly responses: Readonly<Record<string, ResponseDoc>>
}

/**
 * `operation` as a route's `detail`. Elysia types `detail` as OpenAPI 3.0,
 * while its plugin writes 3.1 (our JSON Schemas use 3.1's `const`,
 * `examples`, numeric `exclusiveMaximum`), hence the cast.
 */
export function detail(operation: OperationDoc): DocumentDecoration {
  return operation as unknown as DocumentDecoration
}

/** The answers the plugin itself gives, whatever the route. */
export function pluginAnswers(ttlSeconds: number): Record<string, ResponseDoc> {
  return {
    400: problemAnswer(['missing-idempotency-key', 'invalid-idempotency-key', 'invalid-json', 'invalid-body'],
      'The key is missing or malformed, or the body is not JSON, outside the schema, has unknown fields or a NUL character. Nothing was stored.'),
    401: problemAnswer(['unauthorized'], 'No or wrong credentials.', { 'WWW-Authenticate': header('The scheme to use: `Bearer`.', Type.String()) }),
    409: problemAnswer(['in-progress', 'lease-lost'],
      `\`in-progress\`: a request with this key is still being processed; answered at once, never by waiting. \`Retry-After\` is at most the TTL the claim has left (${ttlSeconds} s at most). ` +
      '`lease-lost`: this request lost its claim to a retry or an operator; its writes were rolled back.'),
    413: problemAnswer(['body-too-large'], 'The body is over the size limit. Nothing was stored.'),
    415: problemAnswer(['unsupported-media-type'], 'Content-Type is not application/json. Nothing was stored.'),
    422: problemAnswer(['idempotency-key-reused'], 'This key was used for a different request (method, path or body; JSON key order and white space do not count), finished or still processing.'),
    500: problemAnswer(['internal'], 'Processing failed; the key was released, so a retry runs again.'),
    503: problemAnswer(['database-unavailable', 'shutting-down'], 'The database is unavailable, or this server stopped before the request finished; the key was released (or becomes reclaimable after the TTL).'),
    504: problemAnswer(['deadline-exceeded'], 'Processing ran into its deadline; its writes rolled back, the key released.'),
  }
}

/**
 * The operation: the Idempotency-Key header, the body schema, the route's
 * answers (each may be replayed: `Idempotent-Replayed`) and the plugin's.
 */
export function idempotentOperation(body: TSchema | undefined, docs: RouteDocs, ttlSeconds: number): OperationDoc {
  const own: Record<string, ResponseDoc> = {}
  for (const [status, response] of Object.entries(docs.responses ?? {}))
    own[status] = Number(status) < 500 ? { ...response, headers: { ...response.headers, 'Idempotent-Replayed': REPLAYED } } : response
  return {
    ...(docs.summary ? { summary: docs.summary } : {}),
    description: [
      docs.description,
      'Idempotent: send an `Idempotency-Key`. A retry with the same key and the same request gets the first answer again, ' +
      'status and body byte for byte, with `Idempotent-Replayed: true`; while the first is processing it gets 409 with `Retry-After`; ' +
      'with another request under the same key it gets 422. A failed request (5xx) releases its key, so a retry runs again.',
    ].filter(Boolean).join('\n\n'),
    ...(docs.tags ? { tags: [...docs.tags] } : {}),
    ...(docs.operationId ? { operationId: docs.operationId } : {}),
    parameters: [{ name: 'Idempotency-Key', in: 'header' as const, required: true, schema: IdempotencyKey }],
    ...(body ? { requestBody: { required: true, content: { 'application/json': { schema: body } } } } : {}),
    responses: { ...pluginAnswers(ttlSeconds), ...own },
  }
}
