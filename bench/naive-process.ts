import type { Subprocess } from 'bun'
import { join } from 'node:path'

/** The downstream keys the naive app sends the provider start with these, so the bench tells its charges apart in a ledger. */
export const NAIVE_DOWNSTREAM_PREFIX = 'naive_'
export const BASELINE_DOWNSTREAM_PREFIX = 'bench_'
/** Its one API key (Bearer). */
export const NAIVE_API_KEY = 'naive-key-0123456789abcdef0123456789'

export interface NaiveApp {
  readonly url: string
  readonly proc: Subprocess
  output(): string
  stop(): Promise<void>
}

/** Starts bench/naive-app.ts as a process of its own on a free port, on `databaseUrl`, charging through `providerUrl`. */
export async function startNaiveApp(databaseUrl: string, providerUrl: string, timeoutMs = 15_000): Promise<NaiveApp> {
  const proc = Bun.spawn([process.execPath, join(import.meta.dir, 'naive-app.ts')], {
    env: { ...process.env, DATABASE_URL: databaseUrl, PAYMENT_PROVIDER_URL: providerUrl, PORT: '0', NODE_ENV: 'production' },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  let output = ''
  const decoder = new TextDecoder()
  const url = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the naive app did not start in ${timeoutMs} ms:\n${output}`)), timeoutMs)
    const read = async (stream: ReadableStream<Uint8Array>) => {
      const reader = stream.getReader()
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
        output += decoder.decode(chunk.value)
        const match = /listening on (http:\S+)/.exec(output)
        if (match) {
          clearTimeout(timer)
          resolve(match[1]!)
        }
      }
    }
    void read(proc.stdout)
    void read(proc.stderr)
    void proc.exited.then((code) => reject(new Error(`the naive app exited with ${code}:\n${output}`)))
  })
  return {
    url: await url,
    proc,
    output: () => output,
    async stop() {
      proc.kill('SIGTERM')
      await proc.exited
    },
  }
}
