/** Load shapes for the scale scenarios, over real HTTP, and the figures they print. */
import { API_KEY } from './world'

export interface Answer {
  readonly status: number | 'network-error'
  readonly id?: string
  readonly replayed: boolean
  /** Client-side latency of this one request. */
  readonly ms: number
  /** performance.now() when the answer came. */
  readonly at: number
  /** The start of an error answer's body: who answered, and why. */
  readonly detail?: string
}

export interface PaymentRequest {
  readonly amount: number
  readonly currency: string
  readonly customer: string
}

export async function post(url: string, key: string, body: PaymentRequest, timeoutMs = 30_000): Promise<Answer> {
  const started = performance.now()
  try {
    const response = await fetch(`${url}/api/payments`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}`, 'idempotency-key': key },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    })
    const text = await response.text()
    const ok = response.status >= 200 && response.status < 300
    const at = performance.now()
    return {
      status: response.status,
      replayed: response.headers.get('idempotent-replayed') === 'true',
      ms: at - started,
      at,
      ...(ok ? { id: (JSON.parse(text) as { id: string }).id } : { detail: text.slice(0, 160) }),
    }
  } catch (error) {
    const at = performance.now()
    return { status: 'network-error', replayed: false, ms: at - started, at, detail: String(error).slice(0, 160) }
  }
}

/** `n` requests with one key, all at once. */
export function storm(url: string, key: string, n: number, body: PaymentRequest): Promise<Answer[]> {
  return Promise.all(Array.from({ length: n }, () => post(url, key, body)))
}

/**
 * A careful client: retries network errors, 5xx and 409 (after at most
 * `pauseMs`, jittered) until a 2xx or the deadline. `url` is read before each
 * attempt. Returns every answer it saw.
 */
export async function untilPaid(url: () => string, key: string, body: PaymentRequest, options: { pauseMs?: number; deadlineMs?: number } = {}): Promise<Answer[]> {
  const answers: Answer[] = []
  const deadline = Date.now() + (options.deadlineMs ?? 90_000)
  while (Date.now() < deadline) {
    const answer = await post(url(), key, body, 15_000)
    answers.push(answer)
    if (answer.id !== undefined) return answers
    if (typeof answer.status === 'number' && answer.status >= 400 && answer.status < 500 && answer.status !== 409)
      throw new Error(`key ${key}: ${answer.status}, which no retry fixes`)
    await Bun.sleep(Math.random() * (options.pauseMs ?? 200))
  }
  throw new Error(`key ${key}: no 2xx in ${options.deadlineMs ?? 90_000} ms; saw ${answers.length} answers: ${JSON.stringify(tally(answers))}, the last: ${answers.at(-1)?.detail}`)
}

/** The 2xx id of a client's answers, if it got one. */
export function paidId(answers: Answer[]): string | undefined {
  return answers.find((a) => a.id !== undefined)?.id
}

/** How many answers of each kind: "201", "201 replay", "409", "network-error", ... */
export function tally(answers: Iterable<Answer>): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const a of answers) {
    const label = a.replayed ? `${a.status} replay` : String(a.status)
    counts[label] = (counts[label] ?? 0) + 1
  }
  return counts
}

export function percentile(values: number[], p: number): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!
}

export function ms(value: number): string {
  return `${value.toFixed(1)}ms`
}
