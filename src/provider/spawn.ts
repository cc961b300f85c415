/**
 * Starts the simulator as its own process (main.ts) and waits until it
 * listens: used by `npm start` when PAYMENT_PROVIDER_URL is unset, and by tests
 * that kill it to prove the ledger durable.
 */
import type { Subprocess } from 'bun'
import { join } from 'node:path'

export interface SpawnSimulatorOptions {
  /** Merged over process.env; undefined removes a variable. */
  readonly env?: Record<string, string | undefined>
  /** Where relative paths (the default ledger) resolve. @default process.cwd() */
  readonly cwd?: string
  /** In a process group of its own, so the service's Ctrl-C (sent to its group) does not stop it before the drain. */
  readonly detached?: boolean
  /** Keep the child's output to ourselves (it is still in a start error) instead of copying it to ours. @default false */
  readonly quiet?: boolean
  /** How long to wait for the listening line. @default START_TIMEOUT_MS */
  readonly timeoutMs?: number
}

export interface SpawnedSimulator {
  readonly url: string
  readonly proc: Subprocess
  /** SIGTERM, then SIGKILL after STOP_GRACE_MS; resolves to the exit code (128 + signal number when killed). */
  stop(): Promise<number>
  /** The last 64 KiB the child printed (stdout and stderr), e.g. for a test's failure message. */
  output(): string
}

/** 15 s: the simulator opens a SQLite file and listens in well under a second; this covers a loaded CI box. */
export const START_TIMEOUT_MS = 15_000
/** 5 s: a clean stop closes sockets and one SQLite file; past this it is stuck, and SIGKILL loses nothing committed. */
export const STOP_GRACE_MS = 5_000

/** 64 KiB of the child's output is kept for a start error. */
const OUTPUT_KEPT_CHARS = 65_536
const MAIN = join(import.meta.dir, 'main.ts')
const LISTENING = /^provider simulator listening on (http:\/\/\S+)$/m

export async function spawnSimulator(options: SpawnSimulatorOptions = {}): Promise<SpawnedSimulator> {
  const env = Object.fromEntries(
    Object.entries({ ...process.env, ...options.env }).filter((entry): entry is [string, string] => entry[1] !== undefined),
  )
  const proc = Bun.spawn([process.execPath, MAIN], {
    env,
    cwd: options.cwd ?? process.cwd(),
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'pipe',
    detached: options.detached ?? false,
  })
  const output = { text: '' }
  const quiet = options.quiet ?? false
  const lines = forward(proc.stdout, quiet ? undefined : process.stdout, output)
  forward(proc.stderr, quiet ? undefined : process.stderr, output)

  const timeoutMs = options.timeoutMs ?? START_TIMEOUT_MS
  let timer: Timer | undefined
  let check = () => {}
  const url = await Promise.race([
    new Promise<string>((resolve) => {
      check = () => {
        const found = LISTENING.exec(output.text)?.[1]
        if (found) resolve(found)
      }
      lines.add(check)
      check()
    }),
    new Promise<string>((resolve) => { timer = setTimeout(() => resolve(`timed out after ${timeoutMs} ms`), timeoutMs) }),
    proc.exited.then((code) => `exited with code ${code}`),
  ])
  clearTimeout(timer)
  lines.delete(check)
  if (!url.startsWith('http://')) {
    proc.kill('SIGKILL')
    throw Object.assign(new Error(`the provider simulator did not start (${url}):\n${output.text}`), { stopSignal: stopSignalOf(proc) })
  }
  return { url, proc, stop: () => stop(proc), output: () => output.text }
}

/**
 * SIGINT or SIGTERM when the child ended by one (killed, or its own handler's
 * exit 130/143): a stop sent to our process group as the child was leaving it,
 * which main.ts treats as our stop once its own handler has seen it.
 */
function stopSignalOf(proc: Subprocess): 'SIGINT' | 'SIGTERM' | undefined {
  const code = proc.signalCode ?? proc.exitCode
  if (code === 'SIGINT' || code === 130) return 'SIGINT'
  if (code === 'SIGTERM' || code === 143) return 'SIGTERM'
  return undefined
}

async function stop(proc: Subprocess): Promise<number> {
  if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM')
  const timer = setTimeout(() => proc.kill('SIGKILL'), STOP_GRACE_MS)
  try {
    return await proc.exited
  } finally {
    clearTimeout(timer)
  }
}

/**
 * Copies a child's stream to ours as it comes (its errors and logs belong in
 * the operator's terminal) and keeps it for the start error. Calls the
 * returned listeners on every chunk, so the listening line is noticed at once.
 */
function forward(stream: ReadableStream<Uint8Array>, to: NodeJS.WriteStream | undefined, output: { text: string }) {
  const listeners = new Set<() => void>()
  void (async () => {
    const decoder = new TextDecoder()
    const reader = stream.getReader()
    for (;;) {
      const { done, value: chunk } = await reader.read()
      if (done) return
      // The tail only: a start error needs the last lines, and the child may run (and log) for weeks.
      output.text = (output.text + decoder.decode(chunk, { stream: true })).slice(-OUTPUT_KEPT_CHARS)
      to?.write(chunk)
      for (const listener of listeners) listener()
    }
  })().catch(() => { /* the child went away; its output so far is kept */ })
  return listeners
}
