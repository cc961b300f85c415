/**
 * The embedded default with two instances of one checkout and with two
 * checkouts (src/store/embedded.ts). A second start of one checkout shares
 * the first one's server and never stops it under it: the last one out
 * stops it. A second checkout never serves on the first one's data: its own
 * server gets a free port, or, with EMBEDDED_PG_PORT chosen, the start fails
 * naming the variable.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import postgres from 'postgres'
import { embeddedDataDir, startEmbedded, SYSTEM_DATA_ROOTS, type EmbeddedPostgres } from '../../src/store/embedded'
import { freePort } from '../chaos/clients'

let temp: string
const started: EmbeddedPostgres[] = []
beforeAll(() => {
  temp = mkdtempSync(join(tmpdir(), 'idem-embedded-sharing-'))
  chmodSync(temp, 0o755) // as root, PostgreSQL runs as `postgres` and must reach its data
})
afterAll(async () => {
  for (const embedded of started) await embedded.stop().catch(() => false)
  rmSync(temp, { recursive: true, force: true })
})

async function start(dir: string, port: number, portChosen: boolean): Promise<EmbeddedPostgres> {
  const embedded = await startEmbedded({ dir: join(temp, dir), port, portChosen, relocate: false })
  started.push(embedded)
  return embedded
}

const postmaster = (embedded: EmbeddedPostgres) => Number(readFileSync(join(embedded.dir, 'postmaster.pid'), 'utf8').split('\n')[0])
const alive = (pid: number) => { try { process.kill(pid, 0); return true } catch { return false } }

async function dataDirectory(url: string): Promise<string> {
  const sql = postgres(url, { max: 1, onnotice: () => undefined })
  try {
    return (await sql<{ dir: string }[]>`select current_setting('data_directory') as dir`)[0]!.dir
  } finally {
    await sql.end({ timeout: 1 })
  }
}

test('two instances of one checkout share its server: the first to stop leaves it to the other, the last stops it', async () => {
  const port = freePort()
  const a = await start('one', port, true)
  const b = await start('one', port, true) // the same checkout's second `npm start`: adopts A's live server
  expect(b.port).toBe(a.port)
  const pid = postmaster(a)
  expect(postmaster(b)).toBe(pid)
  expect(await b.stop()).toBe(false) // B is done: A still uses it
  expect(alive(pid)).toBe(true)
  expect(await dataDirectory(a.url)).toBe(a.dir)
  expect(await a.stop()).toBe(true)
  expect(alive(pid)).toBe(false)
}, 60_000)

test('a second checkout whose port is taken by the first one\'s server starts its own on a free port, never on the other\'s data', async () => {
  const port = freePort()
  const first = await start('first', port, false)
  const second = await start('second', port, false) // the default port, taken: it moves
  expect(second.port).not.toBe(port)
  expect(await dataDirectory(second.url)).toBe(second.dir)
  expect(await dataDirectory(first.url)).toBe(first.dir)
  expect(second.dir).not.toBe(first.dir)
}, 60_000)

test('with EMBEDDED_PG_PORT chosen and taken by another server, the start fails naming the variable', async () => {
  const port = freePort()
  await start('third', port, true)
  await expect(start('fourth', port, true)).rejects.toThrow(/EMBEDDED_PG_PORT: port \d+ is taken by another server/)
}, 60_000)

test('where the data is, for the message of a CLI with no server running: the relocated folder when the data moved there', async () => {
  // A checkout the postgres user cannot reach (a 0700 parent): as root, its data moves under SYSTEM_DATA_ROOTS.
  mkdirSync(join(temp, 'private'), { mode: 0o700 })
  const wanted = join(temp, 'private', 'pg')
  expect(embeddedDataDir({ dir: wanted, relocate: true })).toBe(wanted) // no data anywhere yet: where it would go
  const embedded = await startEmbedded({ dir: wanted, port: freePort(), relocate: true })
  try {
    expect(await embedded.stop()).toBe(true)
    if (process.getuid?.() === 0) expect(embedded.dir.startsWith(SYSTEM_DATA_ROOTS[0]) || embedded.dir.startsWith(SYSTEM_DATA_ROOTS[1])).toBe(true)
    expect(embeddedDataDir({ dir: wanted, relocate: true })).toBe(embedded.dir)
  } finally {
    if (embedded.dir !== wanted) rmSync(dirname(embedded.dir), { recursive: true, force: true })
  }
}, 60_000)
