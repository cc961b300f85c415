import type { Subprocess } from 'bun'
import { waitFor } from './wait'

/**
 * Collects everything a child prints on stdout and stderr; call the result to
 * read it so far. `ended` settles once both streams are read to their end.
 */
export function captureOutput(proc: Subprocess): (() => string) & { readonly ended: Promise<unknown> } {
  let out = ''
  const collect = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder()
    const reader = stream.getReader()
    for (;;) {
      const { done, value } = await reader.read()
      if (done) return
      out += decoder.decode(value, { stream: true })
    }
  }
  const ended = Promise.all([collect(proc.stdout as ReadableStream<Uint8Array>), collect(proc.stderr as ReadableStream<Uint8Array>)]).catch(() => undefined)
  return Object.assign(() => out, { ended })
}

/** The port from the service's "listening on host:port" line, or undefined if it exits or `timeoutMs` passes first. */
export async function waitForListening(proc: Subprocess, output: () => string, timeoutMs: number): Promise<string | undefined> {
  let port: string | undefined
  const listening = () => {
    port = /listening on [^\s]+:(\d+)/.exec(output())?.[1]
    return port !== undefined || proc.exitCode !== null
  }
  await waitFor(listening, 'the service to listen', timeoutMs).catch(() => undefined) // the caller reports it, with the output
  return port
}

/**
 * Tests storm one tenant on purpose (300 concurrent requests with one key,
 * 2000 in flight): the per-tenant rate and in-flight limits (http/rate-limit.ts)
 * are off unless a test sets them; test/security/tenant-limits.test.ts does.
 */
export const NO_TENANT_LIMITS = { TENANT_RATE_LIMIT: '0', TENANT_MAX_IN_FLIGHT: '0' } as const

export interface SpawnedService {
  readonly proc: Subprocess
  readonly url: string
  /** Everything the service printed so far. */
  readonly output: () => string
}

export interface SpawnOptions {
  /** @default [bun, 'src/main.ts'] */
  readonly command?: string[]
  /** Merged over the process environment and the loopback, free-port defaults; undefined removes a variable. */
  readonly env?: Record<string, string | undefined>
  /** In a process group of its own, so a test can signal the whole group. */
  readonly detached?: boolean
  readonly cwd?: string
  readonly timeoutMs?: number
}

/**
 * Starts the service as users run it, on 127.0.0.1 and a free port (PORT=0),
 * and waits for its "listening" line; kills it and throws with its output if
 * it does not come up.
 */
export async function spawnService(options: SpawnOptions = {}): Promise<SpawnedService> {
  const env = { ...process.env, HOST: '127.0.0.1', PORT: '0', PAYMENT_PROVIDER_PORT: '0', TEST_ALLOW_PORT_0: '1', ...NO_TENANT_LIMITS, ...options.env }
  const proc = Bun.spawn(options.command ?? [process.execPath, 'src/main.ts'], {
    env: Object.fromEntries(Object.entries(env).filter(([, value]) => value !== undefined)) as Record<string, string>,
    cwd: options.cwd ?? process.cwd(),
    stdout: 'pipe',
    stderr: 'pipe',
    detached: options.detached ?? false,
  })
  const output = captureOutput(proc)
  const port = await waitForListening(proc, output, options.timeoutMs ?? 20_000)
  if (!port) {
    try { process.kill(options.detached ? -proc.pid : proc.pid, 'SIGKILL') } catch { /* gone */ }
    // What it printed before it exited, read to the end: a start that fails fast used to show nothing.
    await Promise.race([output.ended, Bun.sleep(2_000)])
    throw new Error(`the service did not start (exit ${proc.exitCode ?? proc.signalCode}):\n${output()}`)
  }
  return { proc, url: `http://127.0.0.1:${port}`, output }
}
