import type { Subprocess } from 'bun'
import { captureOutput, waitForListening } from '../test/support/process'

export const BENCH_API_KEY = 'bench-key'
export const BENCH_TENANT = 'bench'

export interface Service {
  readonly url: string
  readonly proc: Subprocess
  stop(): Promise<void>
}

/** Starts `bun src/main.ts` (the product as users run it) on a free port, with the bench-only baseline route. */
export async function startService(databaseUrl: string, env: Record<string, string> = {}, bunArgs: string[] = []): Promise<Service> {
  const proc = Bun.spawn([process.execPath, ...bunArgs, 'src/main.ts'], {
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      HOST: '127.0.0.1',
      PORT: '0',
      TEST_ALLOW_PORT_0: '1',
      API_KEYS: `${BENCH_TENANT}:${BENCH_API_KEY}`,
      ADMIN_TOKEN: 'bench-admin-token',
      BENCH_BASELINE_ROUTE: '1',
      NODE_ENV: 'production',
      ...env,
    },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const out = captureOutput(proc)
  const port = await waitForListening(proc, out, 30_000)
  if (!port) {
    proc.kill('SIGKILL')
    throw new Error(`the service did not start:\n${out()}`)
  }
  return {
    url: `http://127.0.0.1:${port}`,
    proc,
    async stop() {
      proc.kill('SIGTERM')
      await proc.exited
    },
  }
}
