/**
 * The deadline of one execution of a request: a little before its key's TTL
 * ends, so that the completing transaction still fits before the key may be
 * reclaimed. The margin is a tenth of the TTL, between 200 ms and 2 s: with
 * the default 30 s TTL the handler is stopped at 28 s; with a 1 s TTL (the
 * least allowed) at 800 ms.
 */
const MIN_MARGIN_MS = 200
const MAX_MARGIN_MS = 2_000

export function deadlineMarginMs(ttlSeconds: number): number {
  return Math.min(MAX_MARGIN_MS, Math.max(MIN_MARGIN_MS, ttlSeconds * 100))
}

/** Milliseconds a freshly claimed request may run, counted from its claim. */
export function executionBudgetMs(ttlSeconds: number): number {
  return Math.max(0, ttlSeconds * 1000 - deadlineMarginMs(ttlSeconds))
}

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

/** An AbortSignal that fires at the deadline, or earlier when `abort` is called. */
export function deadlineSignal(budgetMs: number): Deadline {
  const controller = new AbortController()
  const timer = setTimeout(() => controller.abort(new DeadlineExceededError(budgetMs)), budgetMs)
  return {
    signal: controller.signal,
    abort: (reason) => controller.abort(reason),
    clear: () => clearTimeout(timer),
  }
}
