/**
 * `idempotent-post/plugin`: make any JSON POST route of an Elysia app
 * idempotent. Knows nothing of the payments service: the app passes its
 * database handles, its tenant resolver and, if it counts anything, hooks.
 *
 *   import { idempotentPost } from 'idempotent-post/plugin'
 *   app.use(idempotentPost({ pools, tenant }, { path, body, act, record }))
 *
 * The database needs the engine's schema first: `migrate(url)` from
 * `idempotent-post/engine`.
 */
export {
  idempotentPost,
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_RETENTION_SECONDS,
  DEFAULT_TTL_SECONDS,
  type ActContext,
  type Database,
  type HandlerResult,
  type IdempotencyOptions,
  type IdempotencyPools,
  type IdempotentRoute,
  type RecordContext,
  type Validation,
} from './idempotency'
export { OUTCOMES, type IdempotencyHooks, type Outcome, type OutcomeEvent, type RouteEvent } from './outcomes'
export { IdempotencyKey, IdempotencyKeyField, problemAnswer, problemAnswers, type ProblemAnswer, type ResponseDoc, type RouteDocs } from './operation'
export { parseIdempotencyKey, type KeyField } from './idempotency-key'
export {
  PLUGIN_PROBLEMS,
  PROBLEMS,
  PROBLEM_CONTENT_TYPE,
  PROBLEM_TYPE_PREFIX,
  ProblemDetails,
  ProblemError,
  codesWithStatus,
  defineProblems,
  isProblemCode,
  problem,
  problemBody,
  problemJson,
  problemResponse,
  problemResult,
  problemSchema,
  problemType,
  type CatalogueOptions,
  type Problem,
  type ProblemCatalogue,
  type ProblemCode,
  type ProblemEntry,
} from './problem'
export { bearerTenant } from './auth'
export { InFlight } from './in-flight'
export { observed, routeLabeler, type AnswerEvent } from './observe'
export type { TransactionSql } from '../core/complete'
