import type { Subprocess } from 'bun'

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
  let out = ''
  const collect = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder()
    for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) out += decoder.decode(chunk, { stream: true })
  }
  void collect(proc.stdout as ReadableStream<Uint8Array>)
  void collect(proc.stderr as ReadableStream<Uint8Array>)
  const deadline = Date.now() + 20_000
  let port: string | undefined
  while (Date.now() < deadline && proc.exitCode === null) {
    port = /listening on [^\s]+:(\d+)/.exec(out)?.[1]
    if (port) break
    await Bun.sleep(20)
  }
  if (!port) {
    proc.kill('SIGKILL')
    throw new Error(`server did not start:\n${out}`)
  }
  return {
    url: `http://127.0.0.1:${port}`,
    proc,
    output: () => out,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null) proc.kill(signal)
      return proc.exited
    },
  }
}
