import { defineProblems, PLUGIN_PROBLEMS } from '../http/problem'

/** The gateway's own refusals, beside the plugin's (422, 409, 400, 413, 503), which it answers too. */
export const UPSTREAM_PROBLEMS = defineProblems({
  'upstream-unreachable': { status: 502, title: 'Upstream unreachable', detail: 'The upstream refused the connection; nothing was sent. The key was released: retry with the same Idempotency-Key.', retryAfterSeconds: 1 },
  'upstream-outcome-unknown': { status: 502, title: 'Upstream outcome unknown', detail: 'The request was sent to the upstream and its answer was lost.' },
  'upstream-timeout': { status: 504, title: 'Upstream timed out', detail: 'The upstream did not answer before the deadline.' },
})

/** Every code the gateway answers with. */
export const GATEWAY_PROBLEMS = PLUGIN_PROBLEMS.with(UPSTREAM_PROBLEMS)
