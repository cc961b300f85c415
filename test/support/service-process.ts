/**
 * `bun src/main.ts` as a real process, charging through a provider the test
 * runs (a simulator process, or a gate in front of one): the service as users
 * run it, with a test database and the suite's API keys and admin token.
 */
import type { Subprocess } from 'bun'
import { spawnService } from './process'
import { ADMIN_TOKEN, API_KEYS } from './server'

export interface ServiceProcess {
  readonly url: string
  readonly proc: Subprocess
  readonly pid: number
  /** Everything it printed so far. */
  output(): string
  /** Its last `lines` lines of output, for a failure message. */
  tail(lines?: number): string
  /** Still running: not exited, not killed. */
  alive(): boolean
  /** Sends `signal` (to its process group with `group`, when started detached; else to it alone) and waits for the exit code. */
  stop(signal?: NodeJS.Signals, options?: { group?: boolean }): Promise<number>
}

export interface ServiceOptions {
  /** In a process group of its own, so a test can signal the group. @default false */
  readonly detached?: boolean
}

export async function startService(databaseUrl: string, providerUrl: string, env: Record<string, string> = {}, options: ServiceOptions = {}): Promise<ServiceProcess> {
  const { proc, url, output } = await spawnService({
    env: { DATABASE_URL: databaseUrl, API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', PAYMENT_PROVIDER_URL: providerUrl, ...env },
    detached: options.detached ?? false,
  })
  const alive = () => proc.exitCode === null && proc.signalCode === null
  return {
    url,
    proc,
    pid: proc.pid,
    output,
    tail: (lines = 30) => output().trimEnd().split('\n').slice(-lines).join('\n'),
    alive,
    async stop(signal = 'SIGTERM', { group = false } = {}) {
      if (alive()) {
        try {
          process.kill(group && options.detached ? -proc.pid : proc.pid, signal)
        } catch { /* gone meanwhile */ }
      }
      return proc.exited
    },
  }
}
