/**
 * Configuration, read once from the environment into one frozen object.
 * The parts live in src/config/: every setting declared once
 * (declarations.ts), read by its declaration (parse.ts, load.ts), the
 * secrets (secrets.ts), the database and provider URLs (database.ts), what
 * production requires (production.ts), near misses of a name (near-miss.ts),
 * and the reference and --help rendered from the declarations (reference.ts).
 * This file is what the rest of the code imports.
 */
export * from './config/constants'
export type { Config } from './config/types'
export { SETTINGS, SETTING_NAMES, type Setting, type SettingName } from './config/declarations'
export { loadConfig } from './config/load'
export { isLoopback, loadDatabaseConfig, plainTextDatabase, plainTextDatabaseUrl, type DatabaseConfig } from './config/database'
export { editDistance, nearMisses, type NearMiss } from './config/near-miss'
