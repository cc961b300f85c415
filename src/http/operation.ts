/**
 * The OpenAPI operation of an idempotent route, built from the same schemas
 * and catalogue the plugin checks and answers with, so the document cannot
 * drift from what the route does. Elysia's OpenAPI plugin picks it up from the
 * route's `detail` (the route keeps parse: 'none' and its own body reader:
 * declaring `body`/`headers` hooks would make Elysia parse and validate too).
 */
import { Type, type TSchema } from '@sinclair/typebox'
import type { DocumentDecoration } from 'elysia'
import { KEY_PATTERN } from './idempotency-key'
import { PLUGIN_PROBLEMS, PROBLEM_CONTENT_TYPE, problemSchema, type ProblemCatalogue } from './problem'

/** The key itself: printable ASCII without space, 1..255 characters (the plugin checks keys with this pattern, once unescaped). */
export const IdempotencyKey = Type.String({
  pattern: KEY_PATTERN.source,
  minLength: 1,
  maxLength: 255,
  description: 'Chosen by the client, one per logical request, sent again unchanged on every retry of it. Scoped by tenant.',
  examples: ['order-7f3c2a-payment'],
})

/**
 * The Idempotency-Key field as sent: the key bare, or as an RFC 8941
 * sf-string (draft-ietf-httpapi-idempotency-key-header), whose parameters
 * are ignored. `k-1` and `"k-1"` are one key.
 */
export const IdempotencyKeyField = Type.Union([
  IdempotencyKey,
  Type.String({ pattern: '^"', description: 'An RFC 8941 sf-string: `"` and `\\` escaped with `\\`; parameters after it (`;x=1`) are ignored. A field starting with `"` that is not one is a 400.', examples: ['"order-7f3c2a-payment"'] }),
])

/** How long keys last: published with every idempotent operation (the draft asks the expiry policy to be). */
export interface KeyPolicyDoc {
  readonly ttlSeconds: number
  readonly retentionSeconds: number
}

/** "86400 s (24 h)": seconds, and the unit a person reads them in. */
export function duration(seconds: number): string {
  const human = seconds % 86_400 === 0 ? `${seconds / 86_400} d` : seconds % 3_600 === 0 ? `${seconds / 3_600} h` : seconds % 60 === 0 ? `${seconds / 60} min` : ''
  return human && seconds >= 60 ? `${seconds} s (${human})` : `${seconds} s`
}

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

/** A problem+json answer whose `code` is one of `codes` (all of one status), from `catalogue`. */
export type ProblemAnswer<Code extends string> = (codes: readonly Code[], description?: string, headers?: Record<string, unknown>) => ResponseDoc

/** `problemAnswer` for the codes of `catalogue` (an app's own, merged with the plugin's: `PLUGIN_PROBLEMS.with(mine)`). */
export function problemAnswers<Code extends string>(catalogue: ProblemCatalogue<Code>): ProblemAnswer<Code> {
  return function problemAnswer(codes, description, headers = {}) {
    const retries = (code: Code) => catalogue.entries[code].retryAfterSeconds !== undefined
    const retryAfter = codes.some(retries)
    return {
      description: description ?? codes.map((code) => `\`${code}\`: ${catalogue.entries[code].title}.`).join(' '),
      ...(retryAfter || Object.keys(headers).length
        ? { headers: { ...(retryAfter ? { 'Retry-After': { ...RETRY_AFTER, required: codes.every(retries) } } : {}), ...headers } }
        : {}),
      content: { [PROBLEM_CONTENT_TYPE]: { schema: problemSchema(codes, catalogue) } },
    }
  }
}

/** A problem+json answer with one of the plugin's codes. */
export const problemAnswer = problemAnswers(PLUGIN_PROBLEMS)

/** An OpenAPI 3.1 parameter object (the parts we use), with `x-` extensions. */
export interface ParameterDoc {
  readonly name: string
  readonly in: 'query' | 'header' | 'path' | 'cookie'
  readonly required: boolean
  readonly schema: unknown
  readonly description?: string
  readonly [extension: `x-${string}`]: unknown
}

/** An OpenAPI 3.1 operation object (the parts we use). */
export interface OperationDoc {
  readonly summary?: string
  readonly description?: string
  readonly tags?: readonly string[]
  readonly operationId?: string
  readonly security?: readonly Record<string, readonly string[]>[]
  readonly parameters?: readonly ParameterDoc[]
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
export function pluginAnswers(policy: KeyPolicyDoc): Record<string, ResponseDoc> {
  return {
    400: problemAnswer(['missing-idempotency-key', 'invalid-idempotency-key', 'invalid-json', 'invalid-body'],
      'The key is missing or malformed (not 1 to 255 printable ASCII characters once unescaped, a malformed sf-string, sent twice), or the body is not JSON, outside the schema, has unknown fields, a NUL character or a member named twice. Nothing was stored.'),
    401: problemAnswer(['unauthorized'], 'No or wrong credentials.', { 'WWW-Authenticate': header('The scheme to use: `Bearer`.', Type.String()) }),
    409: problemAnswer(['in-progress', 'lease-lost'],
      '`in-progress`: a request with this key is still being processed; answered at once, never by waiting. `Retry-After` is about as long as the first request has run so far ' +
      `(at least 1 s, never past the moment its key could be reclaimed: the TTL, ${duration(policy.ttlSeconds)}). ` +
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
 * The Idempotency-Key parameter, with the expiry policy the draft asks to be
 * published: in words, and as `x-idempotency` for tools.
 */
export function idempotencyKeyParameter(policy: KeyPolicyDoc): ParameterDoc {
  return {
    name: 'Idempotency-Key',
    in: 'header',
    required: true,
    description: 'One key per logical request, sent again unchanged on every retry of it; scoped by tenant. ' +
      '1 to 255 printable ASCII characters (0x21 to 0x7E), sent bare (`k-1`) or as an RFC 8941 sf-string (`"k-1"`): both name the key `k-1`. ' +
      `**Expiry:** a completed request's answer is replayed for ${duration(policy.retentionSeconds)} after it finished (a failed request's key stays bound to it as long, from its failure); ` +
      'after that the key is forgotten, and a request under it is a new request. ' +
      `A request still processing after ${duration(policy.ttlSeconds)} (the TTL) may be taken over by a retry. ` +
      'A key stays bound to its first request (method, path, body) for as long as it is kept: another request under it is a 422.',
    schema: IdempotencyKeyField,
    'x-idempotency': {
      retentionSeconds: policy.retentionSeconds,
      ttlSeconds: policy.ttlSeconds,
      scope: 'tenant',
      fingerprint: ['method', 'path', 'body (canonical JSON: key order and white space do not count)'],
    },
  }
}

/**
 * The operation: the Idempotency-Key header, the body schema, the route's
 * answers (each may be replayed: `Idempotent-Replayed`) and the plugin's.
 */
export function idempotentOperation(body: TSchema | undefined, docs: RouteDocs, policy: KeyPolicyDoc): OperationDoc {
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
    parameters: [idempotencyKeyParameter(policy)],
    ...(body ? { requestBody: { required: true, content: { 'application/json': { schema: body } } } } : {}),
    responses: { ...pluginAnswers(policy), ...own },
  }
}
