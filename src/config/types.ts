/** The configuration the service runs with, as loadConfig (load.ts) returns it, frozen. */
import type { OperatorCredential } from '../credentials'
import type { ConnectionSettings } from '../store/connection-settings'

export interface Config {
  /** A real server's URL, or undefined for the embedded PostgreSQL. */
  readonly databaseUrl: string | undefined
  /** DATABASE_URL and the PG* variables resolved once (store/connection-settings.ts): the pools, the probe and the migrations connect by it, REQUIRE_TLS judged it. */
  readonly databaseConnection: ConnectionSettings | undefined
  /** DATABASE_PGBOUNCER=1: DATABASE_URL is a PgBouncer in transaction mode: no prepared statements, no session settings as startup parameters (docs/how-to/pgbouncer.md). */
  readonly databasePgbouncer: boolean
  readonly host: string
  readonly port: number
  /** API key → tenant. */
  readonly apiKeys: ReadonlyMap<string, string>
  /** True when API_KEYS was unset and the dev-only demo tenant is in use. */
  readonly demoKeys: boolean
  /** Who may use /admin (ADMIN_TOKENS and ADMIN_TOKEN): names and token hashes, never the tokens. */
  readonly operators: readonly OperatorCredential[]
  /** The random token of operator "admin" made for this run when no admin token is set (outside production only), to print once. */
  readonly generatedAdminToken: string | undefined
  /**
   * TRUST_PROXY: how many reverse proxies stand in front of the service (0:
   * none). With N > 0 the client address is the Nth X-Forwarded-For entry from
   * the right, and X-Forwarded-Proto: https makes cookies Secure and sends HSTS.
   */
  readonly trustProxy: number
  /** ALLOWED_HOSTS: Host names served besides IP literals and localhost (a defence against DNS rebinding); `any` for `*`. */
  readonly allowedHosts: { readonly any: boolean; readonly names: readonly string[] }
  /** METRICS_TOKEN: when set, /metrics needs `Authorization: Bearer <it>`. */
  readonly metricsToken: string | undefined
  /** METRICS_PORT: when set, /metrics is served there (on METRICS_HOST) and not on PORT. */
  readonly metricsPort: number | undefined
  readonly metricsHost: string
  /** TENANT_RATE_LIMIT: requests per second each tenant may send (per process); 0 is no limit. */
  readonly tenantRateLimit: number
  /** TENANT_RATE_BURST: how many requests a tenant may send at once above its rate. */
  readonly tenantRateBurst: number
  /** TENANT_MAX_IN_FLIGHT: requests of one tenant in processing at once (per process); 0 is no cap. */
  readonly tenantMaxInFlight: number
  /** Age after which a processing key whose owner is gone may be reclaimed. */
  readonly ttlSeconds: number
  /** How long a completed key is replayed. */
  readonly retentionSeconds: number
  /** Base URL of the payment provider, or undefined: `npm start` runs the bundled simulator. */
  readonly providerUrl: string | undefined
  /** Simulator only: where it listens when providerUrl is unset. */
  readonly providerPort: number
  /** Simulator only: latency of every charge. */
  readonly providerDelayMs: number
  /** Simulator only: share (0..1) of charges refused with a 5xx before anything is charged. */
  readonly providerFailureRate: number
  /** Simulator only: share (0..1) of charges made and recorded whose answer is lost (connection dropped). */
  readonly providerLostResponseRate: number
  /** Simulator only: its ledger file (PAYMENT_PROVIDER_LEDGER). */
  readonly providerLedger: string
  /** Server processes sharing the port. */
  readonly workers: number
  /** Larger request bodies get 413. */
  readonly maxBodyBytes: number
  /** Completed keys' answers each process keeps for replays that need no database (REPLAY_CACHE_ENTRIES; 0: none). */
  readonly replayCacheEntries: number
  /** The database gauges at /metrics are recomputed at most once per this many ms (METRICS_CACHE_MS). */
  readonly metricsCacheMs: number
  /** The window of idempotency_duplicate_entities, in seconds (METRICS_DUPLICATE_WINDOW_SECONDS). */
  readonly duplicateWindowSeconds: number
  /** The most keys idempotency_duplicate_entities reads, the newest (METRICS_DUPLICATE_WINDOW_KEYS). */
  readonly duplicateWindowKeys: number
  /** How often each process runs the retention purge of completed keys (PURGE_INTERVAL_MS). */
  readonly purgeIntervalMs: number
  /** Data directory of the embedded PostgreSQL, used when DATABASE_URL is unset (EMBEDDED_PG_DIR, default .data/pg). */
  readonly embeddedDir: string
  /** Wrong API keys or metrics tokens from one address within a minute before it gets 429 (AUTH_FAILURES_PER_MINUTE; 0: never throttled, still counted). */
  readonly authFailuresPerMinute: number
  /** Port of the embedded PostgreSQL (EMBEDDED_PG_PORT, default 54329, off the standard 5432). */
  readonly embeddedPort: number
  /** EMBEDDED_PG_PORT was set: a port taken by another server fails the start instead of moving to a free one. */
  readonly embeddedPortChosen: boolean
  /** REQUIRE_TLS=1: a database or provider connection that may cross the network in plain text refuses the start (else production warns about the database's). */
  readonly requireTls: boolean
  /** DATABASE_URL may cross the network in plain text (plainTextDatabaseUrl): a refusal with REQUIRE_TLS=1, a warning in production. */
  readonly databasePlainText: boolean
  readonly production: boolean
  /** Near misses of a setting's name seen in the environment, to warn about (refused in production: near-miss.ts). */
  readonly warnings: readonly string[]
}

