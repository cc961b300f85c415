/**
 * The driver fixes (src/store/driver-fixes.ts) apply to the installed
 * postgres.js, are in force in this process (bunfig.toml preloads them), and
 * refuse a driver they were not written for. What they fix is proven by
 * test/chaos/edges/driver-after-reset.test.ts and the fault matrix.
 */
import { expect, test } from 'bun:test'
import { join } from 'node:path'
import postgres from 'postgres'
import { DRIVER_FIXES, patchConnectionSource } from '../../src/store/driver-fixes'

const connectionJs = join(import.meta.dir, '..', '..', 'node_modules', 'postgres', 'src', 'connection.js')

test('every fix applies exactly once to the installed driver', async () => {
  const patched = patchConnectionSource(await Bun.file(connectionJs).text())
  for (const fix of DRIVER_FIXES) expect(patched).toContain(fix.to)
})

test('a driver whose code moved is refused, naming the fix that no longer applies', async () => {
  const source = await Bun.file(connectionJs).text()
  const moved = source.replace(DRIVER_FIXES[1]!.from, '/* elsewhere */')
  expect(() => patchConnectionSource(moved)).toThrow(DRIVER_FIXES[1]!.name)
  expect(() => patchConnectionSource(source + source)).toThrow('exactly once')
})

test('the package pins the driver version the fixes were written for', async () => {
  const manifest = await Bun.file(join(import.meta.dir, '..', '..', 'package.json')).json() as { dependencies: Record<string, string> }
  const installed = await Bun.file(join(import.meta.dir, '..', '..', 'node_modules', 'postgres', 'package.json')).json() as { version: string }
  expect(manifest.dependencies.postgres).toBe('3.4.9')
  expect(installed.version).toBe('3.4.9')
})

// Fix 5. Catches: the row counter kept after an error, the next query's rows after empty slots.
test('a query after one that failed mid-result gets its rows from the first slot', async () => {
  const one = postgres(process.env.DATABASE_URL!, { max: 1, fetch_types: false, onnotice: () => undefined })
  try {
    // Three rows come, then the fourth raises.
    const failing = () => one`select i, 1 / (4 - i) as boom from generate_series(1, 10) i`.then(() => 'answered', (error: Error) => error.message)
    expect(await failing()).toContain('division by zero')
    expect([...await one`select 1 as one`]).toEqual([{ one: 1 }])
    // Sent behind it on the same connection (pipelined).
    const [failed, next] = await Promise.all([failing(), one`select 2 as two`])
    expect(failed).toContain('division by zero')
    expect([...next]).toEqual([{ two: 2 }])
  } finally {
    await one.end({ timeout: 1 })
  }
})
