/**
 * The admin's own problem codes, besides the plugin's generic ones
 * (http/problem.ts): a force-expire refused because of the key's state.
 */
import { AGAIN_RETRY_AFTER_SECONDS, defineProblems } from '../http/problem'

export const ADMIN_PROBLEMS = defineProblems({
  'worker-alive': { status: 409, title: 'Worker alive', detail: 'A live worker holds this key and is still processing it; nothing was done.' },
  'key-changed': { status: 409, title: 'Key changed', detail: 'The key is no longer in processing under this lease (completed, released or taken over); nothing was done.' },
  // Retry-After per answer (http/throttle.ts).
  'sign-in-throttled': { status: 429, title: 'Too many failed sign-ins', detail: 'Too many wrong admin tokens from this address; retry after the given seconds.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
})
