/**
 * Every problem code the service answers with: the plugin's generic ones,
 * the payments API's, the admin's, and the service's own (health and
 * metrics). The table of docs/reference/http-api.md lists exactly these, in this order
 * (test/http/problem.test.ts), and merging refuses a code two of them define
 * differently.
 */
import { AGAIN_RETRY_AFTER_SECONDS, PLUGIN_PROBLEMS, DATABASE_RETRY_AFTER_SECONDS, defineProblems } from './http/problem'
import { EDGE_PROBLEMS } from './http/edge-problems'
import { ADMIN_PROBLEMS } from './admin/problems'
import { PAYMENT_PROBLEMS } from './payments/problems'

/** What /readyz and /metrics answer when they cannot. */
export const OPERATIONS_PROBLEMS = defineProblems({
  'not-ready': { status: 503, title: 'Not ready', detail: 'The database does not answer.', retryAfterSeconds: DATABASE_RETRY_AFTER_SECONDS },
  'draining': { status: 503, title: 'Draining', detail: 'This server is stopping: it finishes the requests it has and takes no new ones.', retryAfterSeconds: AGAIN_RETRY_AFTER_SECONDS },
  'metrics-unavailable': { status: 503, title: 'Metrics unavailable', detail: 'The workers\' metrics could not be collected; retry.' },
})

export const SERVICE_PROBLEMS = PLUGIN_PROBLEMS.with(PAYMENT_PROBLEMS).with(ADMIN_PROBLEMS).with(EDGE_PROBLEMS).with(OPERATIONS_PROBLEMS)
export type ServiceProblemCode = (typeof SERVICE_PROBLEMS.codes)[number]
