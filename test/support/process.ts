import type { Subprocess } from 'bun'

/** Collects everything a child prints on stdout and stderr; call the result to read it so far. */
export function captureOutput(proc: Subprocess): () => string {
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
  void collect(proc.stdout as ReadableStream<Uint8Array>)
  void collect(proc.stderr as ReadableStream<Uint8Array>)
  return () => out
}

/** The port from the service's "listening on host:port" line, or undefined if it exits or `timeoutMs` passes first. */
export async function waitForListening(proc: Subprocess, output: () => string, timeoutMs: number): Promise<string | undefined> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline && proc.exitCode === null) {
    const port = /listening on [^\s]+:(\d+)/.exec(output())?.[1]
    if (port) return port
    await Bun.sleep(20)
  }
  return undefined
}
