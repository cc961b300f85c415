/**
 * What a client got for one POST, and the rules a fault test judges it by:
 * an HTTP answer (a 2xx, or an error as problem+json, a 503 with Retry-After),
 * or no answer at all, told apart as a closed connection (the peer went away)
 * or a hang (nothing before the client's own timeout).
 */
import type { PaymentBody } from './http'

export interface Answer {
  readonly key: string
  readonly status: number | 'closed' | 'hung'
  readonly contentType: string | null
  readonly retryAfter: string | null
  /** The problem's `code` and `detail`, for an error answer. */
  readonly code?: string
  readonly detail?: string
  readonly paymentId?: string
  readonly replayed?: boolean
  /** Why there was no answer. */
  readonly error?: string
  readonly ms: number
}

export const PROBLEM_JSON = 'application/problem+json'

/** One POST /api/payments with `key`, bounded by `timeoutMs` (a hang shows as 'hung'). */
export async function send(url: string, key: string, body: PaymentBody, timeoutMs = 15_000, apiKey = 'acme-key'): Promise<Answer> {
  const started = performance.now()
  try {
    const response = await fetch(`${url}/api/payments`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}`, 'idempotency-key': key },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    })
    const text = await response.text()
    const parsed = safeJson(text) as { id?: string; code?: string; detail?: string } | undefined
    const ok = response.status >= 200 && response.status < 300
    return {
      key,
      status: response.status,
      contentType: response.headers.get('content-type'),
      retryAfter: response.headers.get('retry-after'),
      replayed: response.headers.get('idempotent-replayed') === 'true',
      ...(ok && parsed?.id ? { paymentId: parsed.id } : {}),
      ...(!ok && parsed?.code ? { code: parsed.code } : {}),
      ...(!ok && typeof parsed?.detail === 'string' ? { detail: parsed.detail } : {}),
      ms: performance.now() - started,
    }
  } catch (error) {
    const hung = error instanceof Error && error.name === 'TimeoutError'
    return { key, status: hung ? 'hung' : 'closed', contentType: null, retryAfter: null, error: String(error), ms: performance.now() - started }
  }
}

export interface AnswerRules {
  /** A closed connection counts as an answer (a process that stopped under the request). @default false */
  readonly closedAllowed?: boolean
  /** Statuses that may come, besides 2xx and 5xx. @default [409] (a retry of a key in flight) */
  readonly alsoAllowed?: readonly number[]
}

/** What is wrong with each answer that breaks the rules, as "key: why" lines; empty when all hold. */
export function badAnswers(answers: readonly Answer[], rules: AnswerRules = {}): string[] {
  const also = rules.alsoAllowed ?? [409]
  const problems: string[] = []
  for (const answer of answers) {
    const { key, status } = answer
    if (status === 'hung') problems.push(`${key}: no answer within the client's timeout (${Math.round(answer.ms)} ms)`)
    else if (status === 'closed') {
      if (!rules.closedAllowed) problems.push(`${key}: connection closed without an answer (${answer.error})`)
    } else if (status >= 200 && status < 300) {
      if (!answer.paymentId) problems.push(`${key}: ${status} without a payment`)
    } else if (status >= 500 || also.includes(status)) {
      if (!answer.contentType?.startsWith(PROBLEM_JSON)) problems.push(`${key}: ${status} as ${answer.contentType}, not problem+json`)
      if (status === 503 && !(Number(answer.retryAfter) >= 1)) problems.push(`${key}: 503 without Retry-After`)
    } else {
      problems.push(`${key}: ${status} ${answer.code ?? ''}`.trimEnd())
    }
  }
  return problems
}

/** Answers counted by status (and problem code), for the log line: {"201":30,"503 database-unavailable":2}. */
export function tallyAnswers(answers: readonly Answer[]): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const answer of answers) {
    const label = answer.code ? `${answer.status} ${answer.code}` : answer.replayed ? `${answer.status} replay` : String(answer.status)
    counts[label] = (counts[label] ?? 0) + 1
  }
  return counts
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}
