/**
 * `idempotent-post`: what an app needs to make its POST routes idempotent,
 * from one import: the Elysia plugin and its problem catalogue
 * (`idempotent-post/plugin`), and the engine's schema and pools
 * (`migrate`, `openPools`, from `idempotent-post/engine`, which also has
 * the engine's functions without HTTP).
 *
 *   import { idempotentPost, migrate, openPools } from 'idempotent-post'
 */
export * from './http/index'
export { checkSchema, ENGINE_MIGRATIONS, migrate, openPools, SESSION_SETTINGS, startHeartbeat, startRetentionPurge, type HeartbeatOptions, type MigrationLine, type MigrationResult, type Pool, type PoolOptions, type ProcessHeartbeat, type Pools, type RetentionPurge, type RetentionPurgeOptions } from './engine'
