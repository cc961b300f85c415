/**
 * json-server (npm, typicode/json-server 0.17), a server no one here wrote,
 * in a process of its own: every POST /items creates a new record, by
 * design. The gateway's proofs count its records.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { waitForValue } from '../../support/wait'

const BIN = join(import.meta.dir, '..', '..', '..', 'node_modules', 'json-server', 'lib', 'cli', 'bin.js')

export interface JsonServer {
  readonly url: string
  readonly port: number
  /** The records of a collection, as json-server lists them. */
  records(collection?: string): Promise<Record<string, unknown>[]>
  stop(): Promise<void>
}

/** A free TCP port on loopback (asked of the kernel, then let go). */
export function freePort(): number {
  const listener = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const { port } = listener
  listener.stop(true)
  return port
}

/** `delayMs`: json-server's own --delay, added to every answer (a slow upstream). */
export async function startJsonServer(collections: Record<string, unknown[]> = { items: [] }, options: { delayMs?: number } = {}): Promise<JsonServer> {
  const dir = mkdtempSync(join(tmpdir(), 'json-server-'))
  const file = join(dir, 'db.json')
  writeFileSync(file, JSON.stringify(collections))
  const port = freePort()
  const proc: Subprocess = Bun.spawn([process.execPath, BIN, file, '--port', String(port), '--host', '127.0.0.1', '--quiet', ...(options.delayMs ? ['--delay', String(options.delayMs)] : [])], { stdout: 'ignore', stderr: 'pipe' })
  const url = `http://127.0.0.1:${port}`
  const records = async (collection = 'items') => (await (await fetch(`${url}/${collection}`)).json()) as Record<string, unknown>[]
  try {
    await waitForValue('json-server to answer', async () => (await fetch(`${url}/db`)).ok, 20_000)
  } catch (error) {
    proc.kill()
    rmSync(dir, { recursive: true, force: true })
    throw error
  }
  return {
    url,
    port,
    records,
    async stop() {
      proc.kill()
      await proc.exited
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
