import type { Config } from '../config'

/**
 * What the simulator `npm start` runs sees of our environment: its own
 * settings and what any process needs, nothing else. Not ADMIN_TOKEN(S),
 * API_KEYS, DATABASE_URL or METRICS_TOKEN: a process with no authentication
 * of its own has no use for them, and a child's environment is readable by
 * anyone who can read its /proc/<pid>/environ or its crash report.
 */
const INHERITED = ['PATH', 'HOME', 'TMPDIR', 'LANG', 'LC_ALL', 'TZ', 'LOG_LEVEL', 'PAYMENT_PROVIDER_HOST', 'TEST_ALLOW_PORT_0']

/** For spawnSimulator, which merges over our environment: every other variable of ours is removed (undefined). */
export function simulatorEnv(config: Config, env: Record<string, string | undefined>): Record<string, string | undefined> {
  const removed = Object.fromEntries(Object.keys(env).filter((name) => !INHERITED.includes(name)).map((name) => [name, undefined]))
  return {
    ...removed,
    PAYMENT_PROVIDER_PORT: String(config.providerPort),
    PAYMENT_PROVIDER_DELAY_MS: String(config.providerDelayMs),
    PAYMENT_PROVIDER_FAILURE_RATE: String(config.providerFailureRate),
    PAYMENT_PROVIDER_LOST_RESPONSE_RATE: String(config.providerLostResponseRate),
    PAYMENT_PROVIDER_LEDGER: config.providerLedger,
  }
}
