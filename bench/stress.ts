import type { Subprocess } from 'bun'
import { readFileSync } from 'node:fs'

/**
 * One core kept busy by another process, as on a machine that runs more than
 * this service: `stress-ng --cpu 1` (Debian package stress-ng). The issue's
 * target is that the ratios to the naive route are no worse under it: a
 * design that needs more CPU per request loses more when CPU is short.
 */
export const STRESS_COMMAND = ['stress-ng', '--cpu', '1', '--quiet']
export const STRESS_INSTALL_HINT = 'apt-get install stress-ng (Debian/Ubuntu), or set BENCH_STRESS=0 to skip'

/** Whether stress-ng is on PATH. */
export function stressAvailable(): boolean {
  return Bun.which('stress-ng') !== null
}

export interface Stress {
  stop(): Promise<void>
}

/**
 * Starts `stress-ng --cpu 1` for at most `maxSeconds` (its own --timeout, so it
 * cannot outlive a bench that dies) and returns when its worker is running.
 * stop() sends SIGTERM to it (by pid, never by name: other people's stress-ng
 * may run on a shared machine); it stops its worker and exits.
 */
export async function startStress(maxSeconds: number): Promise<Stress> {
  const proc: Subprocess = Bun.spawn([...STRESS_COMMAND, '--timeout', `${Math.ceil(maxSeconds)}s`], { stdout: 'ignore', stderr: 'pipe' })
  // Ready when its worker (a child process) exists; /proc/<pid>/task/<pid>/children lists them.
  const deadline = performance.now() + 5_000
  while (proc.exitCode === null && !hasChildren(proc.pid) && performance.now() < deadline) await Bun.sleep(5)
  if (proc.exitCode !== null) {
    const err = await new Response(proc.stderr as ReadableStream<Uint8Array>).text()
    throw new Error(`stress-ng exited at once (${proc.exitCode}): ${err.trim()}`)
  }
  let stopped: Promise<void> | undefined
  return {
    stop: () => (stopped ??= (async () => {
      proc.kill('SIGTERM')
      await proc.exited
    })()),
  }
}

function hasChildren(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim() !== ''
  } catch {
    return true // no such file on this kernel: go on, the worker follows within a tick
  }
}
