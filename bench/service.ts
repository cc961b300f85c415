import type { Subprocess } from 'bun'
import { spawnService } from '../test/support/process'

export const BENCH_API_KEY = 'bench-key'
export const BENCH_TENANT = 'bench'

export interface Service {
  readonly url: string
  readonly proc: Subprocess
  stop(): Promise<void>
}

/** Starts `bun src/main.ts` (the product as users run it) on a free port, with the bench-only baseline route. */
export async function startService(databaseUrl: string, env: Record<string, string> = {}, bunArgs: string[] = []): Promise<Service> {
  const { proc, url } = await spawnService({
    command: [process.execPath, ...bunArgs, 'src/main.ts'],
    env: {
      DATABASE_URL: databaseUrl,
      API_KEYS: `${BENCH_TENANT}:${BENCH_API_KEY}`,
      ADMIN_TOKEN: 'bench-admin-token',
      BENCH_BASELINE_ROUTE: '1',
      NODE_ENV: 'production',
      ...env,
    },
    timeoutMs: 30_000,
  })
  return {
    url,
    proc,
    async stop() {
      proc.kill('SIGTERM')
      await proc.exited
    },
  }
}
