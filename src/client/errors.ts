/** Why the client stopped retrying. */
export type GiveUpReason = 'deadline' | 'attempts'

/**
 * The operation did not get a final answer in time: every attempt ended in a
 * network error or a retryable status (409, 429, 5xx). The operation may or
 * may not have happened on the server; retrying later with the same `key`
 * is safe and gives its answer.
 */
export class RetriesExhaustedError extends Error {
  override readonly name = 'RetriesExhaustedError'

  constructor(
    readonly reason: GiveUpReason,
    /** The Idempotency-Key every attempt carried: reuse it to resume the same operation. */
    readonly key: string,
    /** How many requests were sent. */
    readonly attempts: number,
    readonly elapsedMs: number,
    /** The status of the last answer, if the last attempt got one. */
    readonly lastStatus: number | undefined,
    /** The error of the last attempt, if it got no answer (network error, attempt timeout). */
    readonly lastError: unknown,
    /** The body of the last answer (problem+json), if it got one. */
    readonly lastBody: string | undefined,
  ) {
    const last = lastStatus !== undefined ? `last status ${lastStatus}` : `last error: ${describe(lastError)}`
    const why = reason === 'deadline' ? 'deadline reached' : 'attempt limit reached'
    super(`idempotent request gave up (${why}) after ${attempts} attempt(s) in ${Math.round(elapsedMs)} ms; ${last}`, { cause: lastError })
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}
