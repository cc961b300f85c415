/**
 * `npm start` and `npm run gateway` run Bun with its allocator keeping the
 * memory it freed (MIMALLOC_PURGE_DELAY=-1, docs/how-to/production.md): the
 * scripts' own text, run by sh as npm runs it, with `bun` found first on PATH
 * as a stub that prints what it was given.
 */
import { afterAll, expect, test } from 'bun:test'
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pkg from '../../package.json' with { type: 'json' }

const stubs = mkdtempSync(join(tmpdir(), 'idem-start-'))
writeFileSync(join(stubs, 'bun'), '#!/bin/sh\necho "MIMALLOC_PURGE_DELAY=${MIMALLOC_PURGE_DELAY-unset} $*"\n')
chmodSync(join(stubs, 'bun'), 0o755)
afterAll(() => rmSync(stubs, { recursive: true, force: true }))

function runScript(script: string, extra: Record<string, string> = {}): string {
  const { MIMALLOC_PURGE_DELAY: _, ...env } = process.env
  const run = Bun.spawnSync(['sh', '-c', script], { env: { ...env, ...extra, PATH: `${stubs}:${process.env.PATH}` }, stdout: 'pipe', stderr: 'pipe' })
  expect(run.exitCode).toBe(0)
  return run.stdout.toString().trim()
}

for (const [name, entry] of [['start', 'src/main.ts'], ['gateway', 'src/gateway/main.ts']] as const) {
  test(`npm run ${name}: Bun runs ${entry} with MIMALLOC_PURGE_DELAY=-1, unless the environment sets its own`, () => {
    const script = pkg.scripts[name]
    expect(runScript(script)).toBe(`MIMALLOC_PURGE_DELAY=-1 ${entry}`)
    expect(runScript(script, { MIMALLOC_PURGE_DELAY: '500' })).toBe(`MIMALLOC_PURGE_DELAY=500 ${entry}`)
  })
}
