import type { Subprocess } from 'bun'
import { spawnService } from '../test/support/process'

// Production mode (NODE_ENV below) refuses keys and tokens under 32 characters or that look typed (zxcvbn: under 83 bits):
// these were drawn once with `openssl rand -base64 30`.
export const BENCH_API_KEY = 'nYJELY-tIANPYsDctEljH1-eibK6rV6Aox_Ef_aw'
export const BENCH_TENANT = 'bench'
/** Production serves /metrics only behind a token (or on a port of its own). */
export const BENCH_METRICS_TOKEN = 'RXELN9bMp-IvlQtO7vwKg109MPUFgD1AUr66sfHZ'
export const BENCH_ADMIN_TOKEN = 'E_yW8DI-rlU1QdLgGytQ8UxtwuSXPh0MvTOgHvtx'

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
      ADMIN_TOKEN: BENCH_ADMIN_TOKEN,
      METRICS_TOKEN: BENCH_METRICS_TOKEN,
      // A benchmark is one tenant at full speed: the per-tenant limits would measure themselves.
      TENANT_RATE_LIMIT: '0',
      TENANT_MAX_IN_FLIGHT: '0',
      NODE_ENV: 'production',
      // As `npm start` and the systemd unit run it (docs/how-to/production.md): the allocator keeps what it freed.
      MIMALLOC_PURGE_DELAY: '-1',
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
