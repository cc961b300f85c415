/**
 * Every setting, declared once: its name, type, default, bounds, production
 * rule and one line of help. The loader (load.ts) reads each value by these
 * bounds, production.ts derives what production requires, near-miss.ts
 * knows the names, and reference.ts renders docs/reference/settings.md and
 * `bun src/main.ts --help` from them.
 *
 * Plain declarations, not a TypeBox schema: the values are environment
 * strings with rules of their own (a whole number that parses whole, a port
 * that is 0 only in tests, secrets judged by entropy), the messages must name
 * the variable and the fix, and the simulator and the CLI load this without
 * the web framework's schema library (a peer dependency of the plugin only).
 */
import * as d from './constants'

export type Group = 'Service' | 'Database' | 'Idempotency keys' | 'Access' | 'Limits' | 'Metrics' | 'Payment provider' | 'Development and tests'

interface Base {
  readonly group: Group
  /** One sentence: what it does. */
  readonly help: string
  /**
   * NODE_ENV=production: unset refuses the start, for this reason (unless
   * `orElse` is set). production.ts reads it; the reference prints it.
   */
  readonly required?: { readonly because: string; readonly orElse?: string }
  /** Any other production rule, as the reference states it (the loader's code enforces it). */
  readonly production?: string
  /** Holds a secret: never printed; in production at least 32 characters of 96 bits. */
  readonly secret?: true
  /** A rule beyond the bounds (another setting's), as the reference states it. */
  readonly rule?: string
}
export interface IntegerSetting extends Base { readonly kind: 'integer'; readonly default: number; readonly min: number; readonly max: number }
/** A port: 1..65535 (0, any free port, only with TEST_ALLOW_PORT_0=1 where `anyInTests`); `default` undefined: off unless set. */
export interface PortSetting extends Base { readonly kind: 'port'; readonly default: number | undefined; readonly anyInTests?: true }
export interface FractionSetting extends Base { readonly kind: 'fraction'; readonly default: number }
/** 0 or 1. */
export interface FlagSetting extends Base { readonly kind: 'flag' }
/** Free text (an address, a path, a URL, a list); `default` as the reference says it. */
export interface TextSetting extends Base { readonly kind: 'text'; readonly default: string | undefined; readonly unset?: string; readonly choices?: readonly string[] }
/** Once a setting, now refused when set to anything but 0, with this reason. */
export interface RemovedSetting extends Base { readonly kind: 'removed' }
export type Setting = IntegerSetting | PortSetting | FractionSetting | FlagSetting | TextSetting | RemovedSetting

const INT_MAX = Number.MAX_SAFE_INTEGER
const SECRET_RULE = `at least ${d.MIN_PRODUCTION_SECRET_LENGTH} characters and ${d.MIN_PRODUCTION_SECRET_BITS} bits by zxcvbn's estimate (repeats, sequences and words count as few guesses); one secret, one role`

export const SETTINGS = {
  // Service
  HOST: { group: 'Service', kind: 'text', default: d.DEFAULT_HOST, help: 'Listen address of the API, the admin and /docs; loopback unless you open it up (0.0.0.0, ::).' },
  PORT: { group: 'Service', kind: 'port', default: d.DEFAULT_PORT, anyInTests: true, help: 'Port of the API, the admin and /docs (and /metrics unless METRICS_PORT is set).' },
  WORKERS: { group: 'Service', kind: 'integer', default: 1, min: 1, max: 256, help: 'Server processes sharing PORT; above 1 this process only supervises them.' },
  NODE_ENV: { group: 'Service', kind: 'text', default: undefined, unset: 'development', help: '`production` (any letter case) turns on the production rules of every setting.' },
  LOG_LEVEL: { group: 'Service', kind: 'text', default: 'info', choices: ['debug', 'info', 'warn', 'error'], help: 'The least level of the JSON log lines written to stdout.' },
  TRUST_PROXY: { group: 'Service', kind: 'integer', default: 0, min: 0, max: 16, help: 'Reverse proxies in front: the client address is the Nth X-Forwarded-For entry from the right, and X-Forwarded-Proto: https makes cookies Secure and sends HSTS.' },
  ALLOWED_HOSTS: { group: 'Service', kind: 'text', default: undefined, unset: 'the HOST name only', help: 'Host names served besides IP literals and localhost (against DNS rebinding): names separated by commas, a leading dot for a whole domain, or `*`.' },
  // Database
  DATABASE_URL: { group: 'Database', kind: 'text', default: undefined, unset: 'embedded PostgreSQL', required: { because: 'the embedded PostgreSQL is for development' }, production: 'warned about when it reaches another host without sslmode=require', help: 'The PostgreSQL server, a postgres:// or postgresql:// URL (a password in it is never printed); a parameter given twice, or TLS parameters that disagree, refuse the start.' },
  DATABASE_PGBOUNCER: { group: 'Database', kind: 'flag', help: '1: DATABASE_URL is a PgBouncer in transaction mode: no prepared statements, and the start checks the schema instead of migrating.' },
  REQUIRE_TLS: { group: 'Database', kind: 'flag', help: '1: a database or provider connection that may cross the network in plain text refuses the start.' },
  PGSSLMODE: { group: 'Database', kind: 'text', default: undefined, help: 'libpq\'s TLS mode (disable, prefer, require, verify-ca, verify-full) when DATABASE_URL names none: the driver is given it (postgres.js alone ignores it), and REQUIRE_TLS counts it.' },
  PGSSL: { group: 'Database', kind: 'text', default: undefined, help: 'postgres.js\'s TLS mode when DATABASE_URL names none, the same values as PGSSLMODE; the two disagreeing refuse the start.' },
  EMBEDDED_PG_DIR: { group: 'Database', kind: 'text', default: d.DEFAULT_EMBEDDED_DIR, help: 'Data directory of the embedded PostgreSQL, used when DATABASE_URL is unset.' },
  EMBEDDED_PG_PORT: { group: 'Database', kind: 'port', default: d.DEFAULT_EMBEDDED_PORT, help: 'Port of the embedded PostgreSQL; set, a port taken by another server fails the start instead of moving to a free one.' },
  // Idempotency keys
  IDEMPOTENCY_TTL_SECONDS: { group: 'Idempotency keys', kind: 'integer', default: d.DEFAULT_TTL_SECONDS, min: d.MIN_TTL_SECONDS, max: INT_MAX, help: 'The longest a request may process: its work is abandoned before this age, and a processing key older than it may be reclaimed.' },
  IDEMPOTENCY_RETENTION_SECONDS: { group: 'Idempotency keys', kind: 'integer', default: d.DEFAULT_RETENTION_SECONDS, min: 1, max: INT_MAX, rule: 'at least IDEMPOTENCY_TTL_SECONDS', help: 'How long a completed key is replayed.' },
  REPLAY_CACHE_ENTRIES: { group: 'Idempotency keys', kind: 'integer', default: d.DEFAULT_REPLAY_CACHE_ENTRIES, min: 0, max: 1_000_000, help: 'Completed answers each process keeps for replays that need no database (0: none).' },
  PURGE_INTERVAL_MS: { group: 'Idempotency keys', kind: 'integer', default: d.DEFAULT_PURGE_INTERVAL_MS, min: 100, max: 86_400_000, help: 'How often each process purges the keys past their retention.' },
  // Access
  API_KEYS: { group: 'Access', kind: 'text', default: undefined, unset: 'tenant `demo` with key `demo-key` (dev only)', secret: true, required: { because: 'the demo key is dev-only' }, production: `every key ${SECRET_RULE}; not the demo key`, help: 'Tenants and their keys, `tenant:key,tenant2:key2`; the key a request bears decides its tenant.' },
  ADMIN_TOKEN: { group: 'Access', kind: 'text', default: undefined, unset: 'a random token, printed at start', secret: true, required: { because: 'no random token is made', orElse: 'ADMIN_TOKENS' }, production: SECRET_RULE, help: 'The token of operator `admin` for /admin (at least 8 characters).' },
  ADMIN_TOKENS: { group: 'Access', kind: 'text', default: undefined, secret: true, production: SECRET_RULE, help: 'Named operators, `name:token,...` (a token also as `sha256:<64 hex digits>`); names and tokens distinct.' },
  METRICS_TOKEN: { group: 'Access', kind: 'text', default: undefined, unset: '/metrics is open', secret: true, required: { because: '/metrics (tenant names, volumes) is not served to anyone who asks', orElse: 'METRICS_PORT' }, production: SECRET_RULE, help: 'When set, /metrics needs `Authorization: Bearer <it>`.' },
  AUTH_FAILURES_PER_MINUTE: { group: 'Access', kind: 'integer', default: d.DEFAULT_AUTH_FAILURES_PER_MINUTE, min: 0, max: 1_000_000, help: 'Wrong API keys or metrics tokens from one address within a minute before it gets 429 (0: never throttled, still counted).' },
  // Limits
  MAX_BODY_BYTES: { group: 'Limits', kind: 'integer', default: d.DEFAULT_MAX_BODY_BYTES, min: d.MIN_MAX_BODY_BYTES, max: INT_MAX, help: 'Larger request bodies get 413.' },
  TENANT_RATE_LIMIT: { group: 'Limits', kind: 'integer', default: d.DEFAULT_TENANT_RATE_LIMIT, min: 0, max: 1_000_000, help: 'Requests per second each tenant may send, per process (0: no limit).' },
  TENANT_RATE_BURST: { group: 'Limits', kind: 'integer', default: d.DEFAULT_TENANT_RATE_BURST, min: 1, max: 1_000_000, help: 'Requests a tenant may send at once above its rate.' },
  TENANT_MAX_IN_FLIGHT: { group: 'Limits', kind: 'integer', default: d.DEFAULT_TENANT_MAX_IN_FLIGHT, min: 0, max: 1_000_000, help: 'Requests of one tenant in processing at once, per process (0: no cap).' },
  // Metrics
  METRICS_PORT: { group: 'Metrics', kind: 'port', default: undefined, rule: 'not PORT', help: 'When set, /metrics is served on this port (on METRICS_HOST) and not on PORT.' },
  METRICS_HOST: { group: 'Metrics', kind: 'text', default: undefined, unset: 'HOST', help: 'Listen address of METRICS_PORT.' },
  METRICS_CACHE_MS: { group: 'Metrics', kind: 'integer', default: d.DEFAULT_METRICS_CACHE_MS, min: 0, max: 3_600_000, help: 'The database gauges at /metrics are recomputed at most once per this many milliseconds.' },
  METRICS_DUPLICATE_WINDOW_SECONDS: { group: 'Metrics', kind: 'integer', default: d.DEFAULT_DUPLICATE_WINDOW_SECONDS, min: 60, max: 86_400, help: 'The window of idempotency_duplicate_entities, at most (METRICS_DUPLICATE_WINDOW_KEYS).' },
  METRICS_DUPLICATE_WINDOW_KEYS: { group: 'Metrics', kind: 'integer', default: d.DEFAULT_DUPLICATE_WINDOW_KEYS, min: 1_000, max: 1_000_000, help: 'idempotency_duplicate_entities reads at most this many of the newest keys (about 3 µs each): past it the window is shorter, as idempotency_duplicate_window_seconds shows.' },
  // Payment provider
  PAYMENT_PROVIDER_URL: { group: 'Payment provider', kind: 'text', default: undefined, unset: 'the bundled simulator', required: { because: 'the bundled simulator takes no real payments' }, production: 'https://, or http:// to this host only (a sidecar that adds TLS)', help: 'Base URL of the payment provider, http:// or https://.' },
  PAYMENT_PROVIDER_PORT: { group: 'Payment provider', kind: 'port', default: d.DEFAULT_PROVIDER_PORT, anyInTests: true, help: 'Simulator: where it listens when PAYMENT_PROVIDER_URL is unset.' },
  PAYMENT_PROVIDER_HOST: { group: 'Payment provider', kind: 'text', default: '127.0.0.1', help: 'Simulator: its listen address (it has no authentication: loopback unless you must).' },
  PAYMENT_PROVIDER_DELAY_MS: { group: 'Payment provider', kind: 'integer', default: 0, min: 0, max: INT_MAX, help: 'Simulator: latency of every charge.' },
  PAYMENT_PROVIDER_FAILURE_RATE: { group: 'Payment provider', kind: 'fraction', default: 0, help: 'Simulator: share of charges refused with a 5xx before anything is charged.' },
  PAYMENT_PROVIDER_LOST_RESPONSE_RATE: { group: 'Payment provider', kind: 'fraction', default: 0, help: 'Simulator: share of charges made and recorded whose answer is lost (the connection is dropped).' },
  PAYMENT_PROVIDER_LEDGER: { group: 'Payment provider', kind: 'text', default: d.DEFAULT_PROVIDER_LEDGER, help: 'Simulator: its durable ledger (SQLite file).' },
  // Development and tests
  TEST_ALLOW_PORT_0: { group: 'Development and tests', kind: 'flag', help: 'Tests only: 1 lets PORT and PAYMENT_PROVIDER_PORT be 0 (any free port).' },
  BENCH_BASELINE_ROUTE: { group: 'Development and tests', kind: 'removed', help: 'Removed: the service has no yardstick routes any more (npm run bench runs bench/naive-app.ts beside it); set, it refuses the start.' },
} as const satisfies Record<string, Setting>

export type SettingName = keyof typeof SETTINGS
type Declared = typeof SETTINGS
/** The names of the settings of one kind, e.g. `NamesOf<'integer'>`. */
export type NamesOf<K extends Setting['kind']> = { [N in SettingName]: Declared[N]['kind'] extends K ? N : never }[SettingName]

export const SETTING_NAMES = Object.keys(SETTINGS) as SettingName[]

export function declaration(name: SettingName): Setting {
  return SETTINGS[name]
}

/**
 * Variables of this project that are not settings of the service: set by the
 * supervisor for its workers, or read by the project's other tools
 * (`npm run dashboards`). Never taken for a near miss.
 */
export const NOT_SETTINGS = ['IDEMPOTENT_POST_WORKER', 'ADMIN_URL'] as const
