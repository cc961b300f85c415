/**
 * `idempotent-post/engine`: the key lifecycle on PostgreSQL, without HTTP
 * (claim, complete, release, reclaim), the schema it needs, and the database
 * handles it expects.
 *
 *   import { migrate, openPools } from 'idempotent-post/engine'
 *   await migrate(process.env.DATABASE_URL)        // the engine's tables (sql/engine), once per database, safe to run from many processes
 *   const pools = openPools(process.env.DATABASE_URL) // two postgres.js pools with the session deadlines the engine relies on
 *   const purge = startRetentionPurge({ sql: pools.short, retentionSeconds: 86_400 }) // in every process: deletes the keys past retention; purge.stop() at shutdown
 *
 * `migrate` creates only the engine's tables (idempotency_keys,
 * idempotency_processes, idempotency_settings, idempotency_audit) and records
 * them in idempotency_migrations; your own tables are yours to migrate.
 */
export { checkSchema, ENGINE_MIGRATIONS, migrate, type MigrationLine, type MigrationResult } from './store/migrate'
export { openPools, SESSION_SETTINGS, type Pool, type PoolOptions, type Pools } from './store/db'
export { claim } from './core/claim'
export { startHeartbeat, type HeartbeatOptions, type ProcessHeartbeat } from './core/processes'
export { startRetentionPurge, type RetentionPurge, type RetentionPurgeOptions } from './maintenance/retention-purge'
export { complete, type Recording, type TransactionSql } from './core/complete'
export { release } from './core/release'
export { reclaim } from './core/reclaim'
export { fingerprint } from './core/fingerprint'
export { downstreamKey } from './core/downstream-key'
export { deadlineSignal, executionBudgetMs, DeadlineExceededError, ShuttingDownError } from './core/deadline'
export { DatabaseUnavailableError, IdempotencyError, LeaseLostError, SQLSTATE, isUnavailable, sqlState } from './core/errors'
export type { ClaimResult, Clock, Lease, RequestIdentity, StoredResponse } from './core/types'
