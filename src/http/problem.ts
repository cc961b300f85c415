/** RFC 9457 problem details: every error answer of the service is one of these. */

export const PROBLEM_CONTENT_TYPE = 'application/problem+json'

export interface Problem {
  /** A stable, machine-readable code; also the last part of `type`. */
  readonly code: string
  readonly status: number
  readonly title: string
  readonly detail?: string
  readonly [extension: string]: unknown
}

export function problemBody(problem: Problem): string {
  const { code, status, title, detail, ...extensions } = problem
  return JSON.stringify({ type: `urn:idempotent-post:problem:${code}`, title, status, ...(detail ? { detail } : {}), code, ...extensions })
}

export function problemResponse(problem: Problem, headers: Record<string, string> = {}): Response {
  return new Response(problemBody(problem), {
    status: problem.status,
    headers: { 'content-type': PROBLEM_CONTENT_TYPE, ...headers },
  })
}

export const problems = {
  unauthorized: (): Problem => ({ code: 'unauthorized', status: 401, title: 'Missing or invalid API key', detail: 'Send Authorization: Bearer <api key>.' }),
  notFound: (detail = 'No such resource.'): Problem => ({ code: 'not-found', status: 404, title: 'Not found', detail }),
  badRequest: (code: string, detail: string, errors?: string[]): Problem => ({ code, status: 400, title: 'Bad request', detail, ...(errors ? { errors } : {}) }),
  unsupportedMediaType: (): Problem => ({ code: 'unsupported-media-type', status: 415, title: 'Unsupported media type', detail: 'Send Content-Type: application/json.' }),
  tooLarge: (limit: number): Problem => ({ code: 'body-too-large', status: 413, title: 'Request body too large', detail: `The body must be at most ${limit} bytes.` }),
  unavailable: (): Problem => ({ code: 'database-unavailable', status: 503, title: 'Service unavailable', detail: 'The database is unavailable; retry later with the same Idempotency-Key.' }),
  internal: (): Problem => ({ code: 'internal', status: 500, title: 'Internal error', detail: 'The request failed on our side; it may be retried.' }),
} as const
