import type { Subprocess } from 'bun'
import { spawnService } from './process'

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
  const { proc, url, output } = await spawnService({ env: { DATABASE_URL: databaseUrl, API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', ...env } })
  return {
    url,
    proc,
    output,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null) proc.kill(signal)
      return proc.exited
    },
  }
}
