import postgres from 'postgres'

export type Pool = postgres.Sql<Record<string, never>>

/**
 * Seconds to wait for a connection. With postgres.js defaults a request hung
 * up to ~20 s during a 5 s outage; 2 s lets it fail fast with a 503 instead.
 */
const CONNECT_TIMEOUT_SECONDS = 2
/**
 * Seconds between reconnect attempts while the database is away. postgres.js
 * backs off by 3^n/100 s up to 20 s, counted across the pool, so during a 3 s
 * outage queued queries waited up to ~19 s and the service took seconds to
 * notice the database was back (test/chaos/postgres-restart.test.ts). A
 * refused connect costs next to nothing, so retry often: 0.1, 0.2, 0.4, then
 * every 0.5 s.
 */
export function reconnectBackoff(retries: number): number {
  return Math.min(0.05 * 2 ** retries, 0.5)
}
/** No single statement of ours takes a second; 5 s means the database is in trouble. */
const STATEMENT_TIMEOUT_MS = 5_000
/**
 * The hot path never waits on a worker (see core/claim.ts), only on another
 * statement's brief row lock; a second of waiting means something is wrong,
 * and 55P03 is then answered as "in progress".
 */
const LOCK_TIMEOUT_MS = 1_000

export interface Pools {
  /** Short statements: claims, replays, reads, releases. Never held across a handler. */
  readonly short: Pool
  /** Lease-holding transactions, held for a handler's whole run (provider call included). */
  readonly work: Pool
  close(timeoutSeconds?: number): Promise<void>
}

export interface PoolOptions {
  /** Connections for short statements per process. @default 8 */
  readonly shortMax?: number
  /** Connections for handler transactions per process: the in-flight request limit. @default 16 */
  readonly workMax?: number
  readonly applicationName?: string
}

function connect(url: string, max: number, applicationName: string): Pool {
  return postgres(url, {
    max,
    connect_timeout: CONNECT_TIMEOUT_SECONDS,
    backoff: reconnectBackoff,
    idle_timeout: 60,
    max_lifetime: 30 * 60,
    onnotice: () => undefined,
    // bigint (lease) stays a string: exact, and JSON-safe.
    connection: {
      application_name: applicationName,
      statement_timeout: STATEMENT_TIMEOUT_MS,
      lock_timeout: LOCK_TIMEOUT_MS,
    },
  }) as Pool
}

/**
 * Two pools, so that slow handlers holding transactions can never starve the
 * claims and 409 answers of connections (invariant 6).
 */
export function openPools(url: string, options: PoolOptions = {}): Pools {
  const name = options.applicationName ?? 'idempotent-post'
  const short = connect(url, options.shortMax ?? 8, `${name}:short`)
  const work = connect(url, options.workMax ?? 16, `${name}:work`)
  return {
    short,
    work,
    async close(timeoutSeconds = 5) {
      await Promise.all([short.end({ timeout: timeoutSeconds }), work.end({ timeout: timeoutSeconds })])
    },
  }
}

/** True when the database answers within `timeoutMs`. */
export async function databaseAnswers(sql: Pool, timeoutMs = 1_000): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<false>((resolve) => { timer = setTimeout(() => resolve(false), timeoutMs) })
  try {
    return await Promise.race([sql`select 1`.then(() => true, () => false), timeout])
  } finally {
    clearTimeout(timer)
  }
}
