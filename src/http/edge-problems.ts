/**
 * What the service's edge refuses (http/edge.ts, http/rate-limit.ts) before
 * anything was looked at; nothing was stored. Retry-After per answer.
 */
import { AGAIN_RETRY_AFTER_SECONDS, defineProblems } from './problem'

export const EDGE_PROBLEMS = defineProblems({
  'host-not-allowed': { status: 421, title: 'Host not served', detail: 'This server does not answer for this Host (ALLOWED_HOSTS).' },
  'rate-limited': { status: 429, title: 'Too many requests', detail: 'This API key sent more requests than its rate allows; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'too-many-in-flight': { status: 429, title: 'Too many requests in processing', detail: 'This API key has as many requests in processing as this server takes at once; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'credentials-throttled': { status: 429, title: 'Too many wrong credentials', detail: 'Too many wrong API keys or metrics tokens came from your address; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
})
