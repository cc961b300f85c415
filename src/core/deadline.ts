/**
 * The deadline of one execution of a request. Its budget (the TTL less a
 * margin) is a policy rule: see policy.ts, re-exported here for the plugin.
 */
export { deadlineMarginMs, executionBudgetMs } from './policy'

/** Thrown as the abort reason when a request runs into its deadline. */
export class DeadlineExceededError extends Error {
  constructor(readonly budgetMs: number) {
    super(`processing ran into its deadline (${budgetMs} ms)`)
    this.name = 'DeadlineExceededError'
  }
}

/** The abort reason when a draining server stops the requests that outlived its drain. */
export class ShuttingDownError extends Error {
  constructor() {
    super('the server is shutting down')
    this.name = 'ShuttingDownError'
  }
}

export interface Deadline {
  readonly signal: AbortSignal
  /** Stops the request now (a shutdown), before its deadline. */
  readonly abort: (reason: Error) => void
  /** Stops the timer once the request is over. */
  readonly clear: () => void
}

/**
 * An AbortSignal that fires at the deadline, or earlier when `abort` is called.
 * The budget runs from `since` (performance.now(), default: now): the plugin
 * passes the instant before the claim was sent, since the key's TTL runs from
 * the claim statement and not from when its answer arrived.
 */
export function deadlineSignal(budgetMs: number, since = performance.now()): Deadline {
  const controller = new AbortController()
  const timer = setTimeout(() => controller.abort(new DeadlineExceededError(budgetMs)), Math.max(0, since + budgetMs - performance.now()))
  return {
    signal: controller.signal,
    abort: (reason) => controller.abort(reason),
    clear: () => clearTimeout(timer),
  }
}

/**
 * Settles with `work`, or rejects with the signal's reason when it fires
 * first: a handler (or an injected fetch) that ignores its signal still
 * cannot keep the request (or its key) past the deadline. Its late result is
 * dropped, a late failure too (never an unhandled rejection, invariant 9).
 */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    work.catch(() => undefined)
    return Promise.reject(signal.reason)
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason)
    signal.addEventListener('abort', onAbort, { once: true })
    work.then(
      (value) => { signal.removeEventListener('abort', onAbort); signal.aborted ? reject(signal.reason) : resolve(value) },
      (error: unknown) => { signal.removeEventListener('abort', onAbort); reject(signal.aborted ? signal.reason : error) },
    )
  })
}

/** `work`, or `timeout()`'s error after `ms`; the work goes on (its late result is the caller's to handle). */
export function withTimeout<T>(work: Promise<T>, ms: number, timeout: () => Error): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const expired = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(timeout()), ms) })
  return Promise.race([work, expired]).finally(() => clearTimeout(timer))
}
