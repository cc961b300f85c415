/**
 * The client helper: `import { idempotentFetch } from 'idempotent-post/client'`.
 * See docs/reference/client.md.
 */
export { idempotentFetch, isRetryableStatus, DEFAULTS, type IdempotentFetchOptions, type RetryEvent, type FetchLike } from './idempotent-fetch'
export { RetriesExhaustedError, type GiveUpReason } from './errors'
export { fullJitter, retryAfterMs } from './backoff'
