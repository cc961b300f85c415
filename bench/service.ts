import type { Subprocess } from 'bun'
import { spawnService } from '../test/support/process'

// Production mode (NODE_ENV below) refuses keys and tokens under 32 characters.
export const BENCH_API_KEY = 'bench-key-0123456789abcdef0123456789'
export const BENCH_TENANT = 'bench'
/** Production serves /metrics only behind a token (or on a port of its own). */
export const BENCH_METRICS_TOKEN = 'bench-metrics-token-0123456789abcdef01'

export interface Service {
  readonly url: string
  readonly proc: Subprocess
  /** Everything the service printed so far, for error messages. */
  output(): string
  stop(): Promise<void>
}

/**
 * Starts `bun src/main.ts` (the product as users run it) on a free port, against the given provider (the bench starts
 * its own simulators, bench/provider.ts, so the service starts none). `cwd`:
 * another checkout's service instead (an earlier release, for a lever's
 * before and after).
 */
export async function startService(databaseUrl: string, providerUrl: string, env: Record<string, string> = {}, bunArgs: string[] = [], cwd?: string): Promise<Service> {
  const { proc, url, output } = await spawnService({
    command: [process.execPath, ...bunArgs, 'src/main.ts'],
    env: {
      DATABASE_URL: databaseUrl,
      PAYMENT_PROVIDER_URL: providerUrl,
      API_KEYS: `${BENCH_TENANT}:${BENCH_API_KEY}`,
      ADMIN_TOKEN: 'bench-admin-token-0123456789abcdef0123',
      METRICS_TOKEN: BENCH_METRICS_TOKEN,
      // A benchmark is one tenant at full speed: the per-tenant limits would measure themselves.
      TENANT_RATE_LIMIT: '0',
      TENANT_MAX_IN_FLIGHT: '0',
      NODE_ENV: 'production',
      ...env,
    },
    timeoutMs: 30_000,
    ...(cwd ? { cwd } : {}),
  })
  return {
    url,
    proc,
    output,
    async stop() {
      proc.kill('SIGTERM')
      await proc.exited
    },
  }
}
