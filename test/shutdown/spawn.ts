/**
 * Starts the service in a process group of its own (detached), so a test can
 * signal the main process alone (as a container runtime does) or the whole
 * group (as a terminal's Ctrl-C does).
 */
import type { Subprocess } from 'bun'
import { readFileSync } from 'node:fs'
import { NO_TENANT_LIMITS } from '../support/process'
import { ADMIN_TOKEN, API_KEYS } from '../support/server'
import { waitFor } from '../support/wait'

export interface GroupProcess {
  readonly proc: Subprocess
  readonly url: string
  output(): string
  /** Resolves with the exit code; rejects past `timeoutMs` (a hung shutdown). */
  exited(timeoutMs?: number): Promise<number>
}

/** The server's own line (the provider simulator prints a "listening on" line too, without the pid). */
const LISTENING = /listening on \S+:(\d+) \(pid \d+\)/

export async function startDetached(command: string[], env: Record<string, string | undefined>, options: { cwd?: string } = {}): Promise<GroupProcess> {
  const service = spawnDetached(command, env, options)
  const { proc, output } = service
  try {
    await waitWhileStarting(service, () => LISTENING.test(output()) || proc.exitCode !== null, 'the service to listen', 60_000)
  } catch (error) {
    try { process.kill(-proc.pid, 'SIGKILL') } catch { /* gone */ }
    throw error
  }
  const port = LISTENING.exec(output())?.[1]
  if (!port) throw new Error(`the service did not start:\n${output()}`)
  return { ...service, url: `http://127.0.0.1:${port}` }
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

export interface StartingProcess {
  readonly proc: Subprocess
  output(): string
  /** Resolves with the exit code once its output has ended too; rejects past `timeoutMs` (a hung shutdown). */
  exited(timeoutMs?: number): Promise<number>
}

/**
 * Like startDetached, but returns at once: for signalling the service at a
 * chosen point of its start (see waitWhileStarting). On free ports, the
 * provider simulator's included.
 */
export function spawnDetached(command: string[], env: Record<string, string | undefined>, options: { cwd?: string } = {}): StartingProcess {
  const merged = { ...process.env, HOST: '127.0.0.1', PORT: '0', PAYMENT_PROVIDER_PORT: '0', TEST_ALLOW_PORT_0: '1', API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', ...NO_TENANT_LIMITS, ...env }
  const proc = Bun.spawn(command, {
    env: Object.fromEntries(Object.entries(merged).filter(([, value]) => value !== undefined)) as Record<string, string>,
    cwd: options.cwd ?? process.cwd(),
    stdout: 'pipe',
    stderr: 'pipe',
    detached: true,
  })
  let text = ''
  const collect = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder()
    const reader = stream.getReader()
    for (let read = await reader.read(); !read.done; read = await reader.read()) text += decoder.decode(read.value, { stream: true })
  }
  // Both pipes end when the last process holding them is gone: the service and every worker of its group.
  const ended = Promise.all([collect(proc.stdout), collect(proc.stderr)]).catch(() => undefined)
  const output = () => text
  return {
    proc,
    output,
    async exited(timeoutMs = 30_000) {
      let timer: Timer | undefined
      const timeout = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(`no exit within ${timeoutMs} ms:\n${output()}`)), timeoutMs) })
      try {
        const [code] = await Promise.race([Promise.all([proc.exited, ended]), timeout])
        return code
      } finally {
        clearTimeout(timer)
      }
    },
  }
}

/** waitFor (the suite's one), with what the process printed so far in the failure. */
export async function waitWhileStarting(service: { output(): string }, condition: () => boolean, what: string, timeoutMs = 30_000): Promise<void> {
  try {
    await waitFor(condition, what, timeoutMs)
  } catch (error) {
    throw new Error(`${error instanceof Error ? error.message : error}; the process printed:\n${service.output()}`)
  }
}

const SIGNAL_BITS = { SIGINT: 2, SIGTERM: 15 } as const

/**
 * Whether `pid` has its own handler for `signal` (the SigCgt mask in
 * /proc/PID/status): the first moment a signal can be caught rather than
 * kill the process outright.
 */
export function catches(pid: number, signal: keyof typeof SIGNAL_BITS): boolean {
  try {
    const mask = /^SigCgt:\s*([0-9a-f]+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]
    return mask !== undefined && (BigInt(`0x${mask}`) & (1n << BigInt(SIGNAL_BITS[signal] - 1))) !== 0n
  } catch {
    return false
  }
}
