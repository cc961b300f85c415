/**
 * Where the database and the provider are, and whether a connection to them
 * may cross the network in plain text (REQUIRE_TLS). A URL is never part of
 * a message: it may hold a password.
 */
import { ConnectionSettingsError, isLoopback, resolveConnection, type ConnectionSettings } from '../store/connection-settings'
import { ConfigError, DEFAULT_EMBEDDED_DIR, type Env } from './constants'
import { flag, Problems, text } from './parse'
import type { Config } from './types'

/** Where the database is: the part of the configuration the operator CLI shares with the server. */
export interface DatabaseConfig {
  readonly databaseUrl: string | undefined
  /** DATABASE_URL and the PG* variables resolved (store/connection-settings.ts): what the driver is given, and what REQUIRE_TLS judged. */
  readonly databaseConnection?: ConnectionSettings | undefined
  readonly databasePgbouncer: boolean
  /** Data directory of the embedded PostgreSQL, used when DATABASE_URL is unset (EMBEDDED_PG_DIR, default .data/pg). */
  readonly embeddedDir: string
  /** REQUIRE_TLS=1 (see Config). */
  readonly requireTls: boolean
  /** DATABASE_URL reaches another host and nothing makes the driver use TLS (see plainTextDatabaseUrl). */
  readonly databasePlainText: boolean
}

/**
 * DATABASE_URL, DATABASE_PGBOUNCER, EMBEDDED_PG_DIR and REQUIRE_TLS, validated
 * as the server validates them: the CLI and `npm run migrate` call this too,
 * so REQUIRE_TLS=1 keeps them off a plain-text database as it keeps the server.
 * loadConfig passes `{ tls: false }` and judges the database and the provider together.
 */
export function loadDatabaseConfig(env: Env = process.env, options: { tls?: boolean } = {}): DatabaseConfig {
  const problems = new Problems()
  const databaseConnection = problems.take(() => databaseConnectionOf(env), undefined)
  const requireTls = problems.take(() => flag(env, 'REQUIRE_TLS'), false)
  const databasePgbouncer = problems.take(() => flag(env, 'DATABASE_PGBOUNCER'), false)
  const embeddedDir = text(env, 'EMBEDDED_PG_DIR') ?? DEFAULT_EMBEDDED_DIR
  const databasePlainText = databaseConnection?.plainText ?? false
  if (options.tls !== false && requireTls && databasePlainText) problems.add(databasePlainTextRefused(databaseConnection))
  problems.throwIfAny()
  return { databaseUrl: databaseConnection?.url, databaseConnection, databasePgbouncer, embeddedDir, requireTls, databasePlainText }
}

/** DATABASE_URL resolved with the PG* variables, or undefined when unset; a URL the driver would read otherwise than the check is refused, naming its parameter. */
function databaseConnectionOf(env: Env): ConnectionSettings | undefined {
  const databaseUrl = text(env, 'DATABASE_URL')
  if (databaseUrl === undefined) return undefined
  try {
    return resolveConnection(databaseUrl, env)
  } catch (error) {
    if (error instanceof ConnectionSettingsError) throw new ConfigError(error.variable, error.reason)
    throw error
  }
}

export { isLoopback }

/**
 * Whether a connection to `url` may cross the network in plain text: a host
 * other than this one (every host of a multi-host URL; a Unix socket never
 * leaves it) and no TLS mode that holds (store/connection-settings.ts: the
 * URL's, else PGSSLMODE or PGSSL). A URL that is refused counts as plain text.
 */
export function plainTextDatabaseUrl(databaseUrl: string, env: Env = {}): boolean {
  try {
    return resolveConnection(databaseUrl, env).plainText
  } catch {
    return true
  }
}

const DATABASE_PLAIN_TEXT = 'reaches another host without sslmode=require (or verify-ca, verify-full): keys, answers and payments may cross the network in plain text'
const databasePlainTextRefused = (settings: ConnectionSettings | undefined) =>
  new ConfigError('DATABASE_URL', `${DATABASE_PLAIN_TEXT}${chosenBy(settings)}, and REQUIRE_TLS=1 refuses that: add sslmode=verify-full (or require) to it, or unset REQUIRE_TLS`)
/** Which setting made it plain text, when one did (the URL's sslmode over a PGSSLMODE that asked for TLS reads as an accident). */
const chosenBy = (settings: ConnectionSettings | undefined): string =>
  !settings || settings.sslmodeFrom === 'default' ? '' : ` (${settings.sslmodeFrom.startsWith('PG') ? settings.sslmodeFrom : `its ${settings.sslmodeFrom}`} makes it ${settings.sslmode}, which may speak plain text)`
const providerPlainTextRefused = () => new ConfigError('PAYMENT_PROVIDER_URL', 'is plain http:// to another host (charges and the provider\'s credentials in plain text), and REQUIRE_TLS=1 refuses that: use https://, or http:// to this host (a sidecar that adds TLS)')

/**
 * The warning a production start without REQUIRE_TLS=1 gives for a database
 * reached in plain text, or undefined. Warned, not refused, by default: a
 * private network is a decision the operator may have made; REQUIRE_TLS=1
 * makes it a refusal (loadConfig).
 */
export function plainTextDatabase(config: Pick<Config, 'production' | 'databaseUrl'> & { readonly databasePlainText?: boolean; readonly databaseConnection?: ConnectionSettings | undefined }): string | undefined {
  if (!config.production || !config.databaseUrl || !(config.databasePlainText ?? plainTextDatabaseUrl(config.databaseUrl))) return undefined
  return `DATABASE_URL ${DATABASE_PLAIN_TEXT}${chosenBy(config.databaseConnection)} (REQUIRE_TLS=1 refuses such a start)`
}

/**
 * REQUIRE_TLS=1: each connection that may cross the network in plain text,
 * named by its variable, all at once (fixing one and restarting to learn of
 * the next costs a restart).
 */
export function refusePlainText(database: DatabaseConfig, provider: URL | undefined): void {
  if (!database.requireTls) return
  const refused = [
    ...(database.databasePlainText ? [databasePlainTextRefused(database.databaseConnection)] : []),
    ...(provider?.protocol === 'http:' && !isLoopback(provider.hostname) ? [providerPlainTextRefused()] : []),
  ]
  if (refused.length === 1) throw refused[0]!
  if (refused.length > 1) throw new ConfigError(refused[0]!.variable, `REQUIRE_TLS=1 refuses ${refused.length} plain-text connections:\n${refused.map((error) => `  ${error.message}`).join('\n')}`, refused)
}

export function providerUrl(env: Env): string | undefined {
  const raw = text(env, 'PAYMENT_PROVIDER_URL')
  if (!raw) return undefined
  // Never repeated in the message: it may carry the provider's credentials (user:password@, ?key=).
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    throw new ConfigError('PAYMENT_PROVIDER_URL', 'must be an http:// or https:// URL; it does not parse (not shown: it may hold credentials)')
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new ConfigError('PAYMENT_PROVIDER_URL', `must be an http:// or https:// URL, got one with the scheme ${JSON.stringify(url.protocol.slice(0, 16))}`)
  return raw.replace(/\/+$/, '')
}
