import type { Subprocess } from 'bun'
import { captureOutput, waitForListening } from './process'

export interface ServerProcess {
  readonly url: string
  readonly proc: Subprocess
  /** Everything the server printed so far. */
  output(): string
  /** Sends a signal and waits for the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number>
}

export const API_KEYS = 'acme:acme-key,globex:globex-key'
export const ADMIN_TOKEN = 'test-admin-token-123'

/**
 * Starts `bun src/main.ts` as a real process on a free port: the product as a
 * user runs it, over real HTTP.
 */
export async function startServer(databaseUrl: string, env: Record<string, string> = {}): Promise<ServerProcess> {
  const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      HOST: '127.0.0.1',
      PORT: '0',
      TEST_ALLOW_PORT_0: '1',
      API_KEYS,
      ADMIN_TOKEN,
      NODE_ENV: 'test',
      ...env,
    },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const out = captureOutput(proc)
  const port = await waitForListening(proc, out, 20_000)
  if (!port) {
    proc.kill('SIGKILL')
    throw new Error(`server did not start:\n${out()}`)
  }
  return {
    url: `http://127.0.0.1:${port}`,
    proc,
    output: out,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null) proc.kill(signal)
      return proc.exited
    },
  }
}
