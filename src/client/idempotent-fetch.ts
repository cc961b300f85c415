import { fullJitter, retryAfterMs } from './backoff'
import { RetriesExhaustedError, type GiveUpReason } from './errors'

export type FetchLike = (input: string | URL, init: RequestInit) => Promise<Response>

export interface RetryEvent {
  /** The attempt that just failed (1 for the first request). */
  readonly attempt: number
  readonly key: string
  /** Its status, when it got an answer. */
  readonly status?: number
  /** Its error, when it got none (network error, attempt timeout). */
  readonly error?: unknown
  /** How long the client waits before the next attempt. */
  readonly delayMs: number
}

export interface IdempotentFetchOptions {
  /** The Idempotency-Key of this logical operation, sent on every attempt. @default crypto.randomUUID() */
  readonly key?: string
  /** Total time budget, from the call to the last attempt's start. @default 30_000 */
  readonly deadlineMs?: number
  /** Requests sent at most, the first included. @default 10 */
  readonly maxAttempts?: number
  /** One attempt (answer and body) may take this long before it counts as a network error. @default 10_000 */
  readonly attemptTimeoutMs?: number
  /** Backoff ceiling of the first retry; doubles per retry. @default 100 */
  readonly baseDelayMs?: number
  /** Backoff ceiling never grows past this. @default 5_000 */
  readonly maxDelayMs?: number
  /** A server's Retry-After is honoured up to this long; a longer one is cut to it. @default 10_000 */
  readonly maxRetryAfterMs?: number
  /** Aborts the whole operation at once (no further retry); the promise rejects with the signal's reason. */
  readonly signal?: AbortSignal
  /** Called before each wait, e.g. to log or count retries. */
  readonly onRetry?: (event: RetryEvent) => void
  /** Injectable for tests. @default globalThis.fetch */
  readonly fetch?: FetchLike
  /** Injectable for tests. @default a setTimeout that the signal cancels */
  readonly sleep?: (ms: number, signal?: AbortSignal) => Promise<void>
  /** Injectable for tests: the jitter draw, in [0, 1). @default Math.random */
  readonly random?: () => number
  /** Injectable for tests: wall clock in ms, for the deadline and Retry-After dates. @default Date.now */
  readonly now?: () => number
}

export const DEFAULTS = Object.freeze({
  /** 30 s: the server's key TTL; past it a stuck attempt's key is reclaimable anyway, so a later call resumes it. */
  deadlineMs: 30_000,
  maxAttempts: 10,
  /** 10 s: far above a healthy answer (milliseconds) yet under the deadline, so a hung connection costs one attempt, not the call. */
  attemptTimeoutMs: 10_000,
  /** 100 ms doubling: retries 1..6 wait on average 50, 100, 200, 400, 800, 1600 ms, then at most 5 s. */
  baseDelayMs: 100,
  maxDelayMs: 5_000,
  maxRetryAfterMs: 10_000,
})

/** 409 (in progress, claim lost), 429, and 5xx except those that repeat identically (501, 505). */
export function isRetryableStatus(status: number): boolean {
  if (status === 409 || status === 429) return true
  return status >= 500 && status <= 599 && status !== 501 && status !== 505
}

/** Statuses whose Response must have a null body. */
const NULL_BODY_STATUS = new Set([101, 103, 204, 205, 304])

/**
 * Sends one logical operation (by default a POST) to an idempotent endpoint
 * and retries it until it gets a final answer: the same Idempotency-Key on
 * every attempt, so the server runs it at most once however many attempts
 * reach it.
 *
 * Retries network errors (including a body cut mid-way and an attempt that
 * exceeds `attemptTimeoutMs`), 409, 429 and 5xx, waiting the server's
 * Retry-After when it gives one, else exponential backoff with full jitter.
 * Any other answer is returned as is: 2xx, a replay, and 4xx such as 400 or
 * 422 (the key was used for a different request), which no retry can fix.
 * After `deadlineMs` or `maxAttempts` it rejects with RetriesExhaustedError.
 *
 * The returned Response's body is already read into memory (so a connection
 * cut mid-body is retried here, not thrown at the caller later); its `url`
 * and `redirected` are not kept.
 */
export async function idempotentFetch(input: string | URL, init: RequestInit = {}, options: IdempotentFetchOptions = {}): Promise<Response> {
  const fetchImpl = options.fetch ?? ((url, requestInit) => fetch(url, requestInit))
  const sleep = options.sleep ?? abortableSleep
  const random = options.random ?? Math.random
  const now = options.now ?? Date.now
  const deadlineMs = options.deadlineMs ?? DEFAULTS.deadlineMs
  const maxAttempts = options.maxAttempts ?? DEFAULTS.maxAttempts
  const attemptTimeoutMs = options.attemptTimeoutMs ?? DEFAULTS.attemptTimeoutMs
  const baseDelayMs = options.baseDelayMs ?? DEFAULTS.baseDelayMs
  const maxDelayMs = options.maxDelayMs ?? DEFAULTS.maxDelayMs
  const maxRetryAfterMs = options.maxRetryAfterMs ?? DEFAULTS.maxRetryAfterMs
  const { signal } = options

  const url = new URL(input) // fails at once on a bad URL instead of retrying it
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new TypeError(`idempotentFetch: not an http(s) URL: ${url.protocol}`)
  if (init.body instanceof ReadableStream) throw new TypeError('idempotentFetch: a stream body cannot be sent again on retry; pass a string or bytes')
  const headers = new Headers(init.headers)
  const key = idempotencyKey(headers, options.key)
  headers.set('idempotency-key', key)
  const requestInit: RequestInit = { ...init, method: init.method ?? 'POST', headers }

  const started = now()
  const deadline = started + deadlineMs
  let attempts = 0
  let lastStatus: number | undefined
  let lastError: unknown
  let lastBody: string | undefined
  for (;;) {
    signal?.throwIfAborted()
    attempts += 1
    let delayMs: number
    try {
      const response = await attempt(Math.max(1, Math.min(attemptTimeoutMs, deadline - now())))
      if (!isRetryableStatus(response.status)) return response
      lastStatus = response.status
      lastError = undefined
      lastBody = await response.text()
      const asked = retryAfterMs(response.headers.get('retry-after'), now())
      delayMs = asked !== undefined ? Math.min(asked, maxRetryAfterMs) : backoff()
    } catch (error) {
      if (signal?.aborted) throw signal.reason
      lastStatus = undefined
      lastBody = undefined
      lastError = error
      delayMs = backoff()
    }
    if (attempts >= maxAttempts) throw giveUp('attempts')
    // A retry is sent only if it can start before the deadline: no sleeping without a chance.
    if (now() + delayMs >= deadline) throw giveUp('deadline')
    options.onRetry?.({ attempt: attempts, key, delayMs, ...(lastStatus !== undefined ? { status: lastStatus } : { error: lastError }) })
    await sleep(delayMs, signal)
  }

  function backoff(): number {
    return fullJitter(attempts - 1, baseDelayMs, maxDelayMs, random)
  }

  function giveUp(reason: GiveUpReason): RetriesExhaustedError {
    return new RetriesExhaustedError(reason, key, attempts, now() - started, lastStatus, lastError, lastBody)
  }

  /** One request, its body read in full, within `timeoutMs` and the caller's signal. */
  async function attempt(timeoutMs: number): Promise<Response> {
    const controller = new AbortController()
    const onAbort = () => controller.abort(signal?.reason)
    signal?.addEventListener('abort', onAbort, { once: true })
    const timer = setTimeout(() => controller.abort(new Error(`attempt timed out after ${timeoutMs} ms`)), timeoutMs)
    try {
      const response = await fetchImpl(url, { ...requestInit, signal: controller.signal })
      const body = await response.arrayBuffer()
      return new Response(NULL_BODY_STATUS.has(response.status) ? null : body, {
        status: response.status,
        statusText: response.statusText,
        headers: response.headers,
      })
    } finally {
      clearTimeout(timer)
      signal?.removeEventListener('abort', onAbort)
    }
  }
}

/** The key from the options or the caller's header (they must agree), else a new random one. */
function idempotencyKey(headers: Headers, given: string | undefined): string {
  const inHeader = headers.get('idempotency-key')
  if (given !== undefined && inHeader !== null && given !== inHeader)
    throw new TypeError('idempotentFetch: options.key and the Idempotency-Key header differ')
  const key = given ?? inHeader ?? crypto.randomUUID()
  // The server accepts 1..255 printable ASCII characters (0x21..0x7E); anything else is a 400 on every attempt.
  if (!/^[!-~]{1,255}$/.test(key)) throw new TypeError('idempotentFetch: the key must be 1 to 255 printable ASCII characters without spaces')
  return key
}

function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const onAbort = () => {
      clearTimeout(timer)
      reject(signal?.reason)
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}
