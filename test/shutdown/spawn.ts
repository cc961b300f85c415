/**
 * Starts the service in a process group of its own (detached), so a test can
 * signal the main process alone (as a container runtime does) or the whole
 * group (as a terminal's Ctrl-C does).
 */
import type { Subprocess } from 'bun'
import { ADMIN_TOKEN, API_KEYS } from '../support/server'
import { spawnService } from '../support/process'

export interface GroupProcess {
  readonly proc: Subprocess
  readonly url: string
  output(): string
  /** Resolves with the exit code; rejects past `timeoutMs` (a hung shutdown). */
  exited(timeoutMs?: number): Promise<number>
}

export async function startDetached(command: string[], env: Record<string, string | undefined>, options: { cwd?: string } = {}): Promise<GroupProcess> {
  const { proc, url, output: out } = await spawnService({
    command,
    env: { API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', ...env },
    detached: true,
    ...(options.cwd ? { cwd: options.cwd } : {}),
    timeoutMs: 60_000,
  })
  return {
    proc,
    url,
    output: out,
    async exited(timeoutMs = 30_000) {
      const timeout = Bun.sleep(timeoutMs).then(() => { throw new Error(`no exit within ${timeoutMs} ms:\n${out()}`) })
      const code = await Promise.race([proc.exited, timeout])
      await Bun.sleep(50) // let the last output arrive
      return code
    },
  }
}

export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** Pids of the processes in a process group (from /proc), the leader included. */
export function groupMembers(pgid: number): number[] {
  const result = Bun.spawnSync(['ps', '-o', 'pid=', '-g', String(pgid)])
  return result.stdout.toString().split('\n').map((s) => Number(s.trim())).filter((n) => n > 0)
}
