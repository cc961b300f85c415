/**
 * Fixes to postgres.js 3.4.9 (the required driver), applied as it loads.
 *
 * A connection reset or terminated under load left the driver in states no
 * caller can get out of (found by test/chaos/edges: driver-after-reset and
 * the fault matrix):
 *
 * 1. After a socket error, the failed query stays the connection's current
 *    one. A query issued before the close arrives (a retry in the catch, the
 *    next request) queues behind it, the close that follows an error rejects
 *    nothing (`!hadError && ...`), and it hangs; and every query that reaches
 *    that connection object later queues behind the dead one: the slot never
 *    serves again, each query fails after connect_timeout. (Upstream:
 *    porsager/postgres#1130, PR #1142, unreleased.)
 * 2. A query sent through a connection object after its close (a transaction
 *    scope's next statement) is written to a socket that is gone: `socket`
 *    is null in nextWrite, a TypeError thrown from setImmediate, an uncaught
 *    exception that ended the process (invariant 9).
 *
 * 3. A close kept the bytes it had not written yet and the handle of their
 *    timer, so the reconnect's startup message was queued behind them and
 *    never sent: every reconnect of that slot timed out (CONNECT_TIMEOUT).
 * 4. With several hosts, a connection counts as connecting until its first
 *    query's answer (it runs that query, then moves to open), and an error
 *    on a connecting connection is skipped to try the next host: a first
 *    query whose server died under it was never settled. A failover under
 *    load (new connections opened while commits waited for a synchronous
 *    standby) left queries pending forever; the heartbeat's was one, and the
 *    service's SIGTERM drain waited for it (test/scale/failover.scale.ts).
 *
 * 5. A query that failed after some of its rows had come (an error raised
 *    by a later row, a statement timeout mid-result) left the connection's
 *    row counter where it was: the next query on that connection got its
 *    rows after as many empty slots, and `const [row] = await sql...` read
 *    undefined (porsager/postgres#1119). Seen on Citus as a 500 for a claim
 *    pipelined behind a call that timed out on a frozen worker.
 *
 * The fixes: a dead connection forgets its current query; a close rejects
 * whatever is still pending, with or without an error, and drops its unsent
 * bytes; a query through a closed connection is rejected
 * (CONNECTION_CLOSED) instead of written; a first query whose connection
 * dies is rejected, however many hosts the URL names; an error resets the
 * row counter.
 *
 * How: a Bun runtime plugin rewrites connection.js as it is imported (no
 * patched copy of node_modules, nothing run at install time: a package that
 * depends on ours would get no install-time patch anyway). It must be loaded
 * before postgres.js is: bunfig.toml preloads it for every `bun` run in this
 * checkout (the service, the CLI, tests, the bench), and main.ts imports it
 * first. Each replacement must match exactly once, or the import fails,
 * naming the fix: a different driver version is refused rather than run
 * unpatched (package.json pins postgres to 3.4.9).
 */
import { plugin } from 'bun'
import { dirname, resolve } from 'node:path'

interface Fix {
  readonly name: string
  readonly from: string
  readonly to: string
}

export const DRIVER_FIXES: readonly Fix[] = [
  {
    name: 'a connection that errored forgets its current query',
    from: `    errored(err)
    while (sent.length)
      queryError(sent.shift(), err)
  }`,
    to: `    errored(err)
    while (sent.length)
      queryError(sent.shift(), err)
    query = null /* idempotent-post driver-fixes: 1 */
  }`,
  },
  {
    name: 'a close rejects what is pending, also after an error',
    from: `    !hadError && (query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))`,
    // An \`if\`, not \`(a || b) && ...\`: the line before ends without a semicolon (\`return reconnect()\`).
    to: `    if (query || sent.length) error(Errors.connection('CONNECTION_CLOSED', options, socket)) /* idempotent-post driver-fixes: 1 */`,
  },
  {
    // The slot that never served again: the close cleared the write timer but
    // kept its handle and the unsent bytes, so the next connection's startup
    // message was appended to the dead one's bytes and never scheduled: each
    // reconnect timed out (CONNECT_TIMEOUT) with the socket open and silent.
    name: 'a close drops the bytes not yet written, and their timer',
    from: `    incomings = null
    clearImmediate(nextWriteTimer)`,
    to: `    incomings = null
    clearImmediate(nextWriteTimer)
    chunk = nextWriteTimer = null /* idempotent-post driver-fixes: 3 */`,
  },
  {
    name: 'a query through a closed connection is rejected, never written',
    from: `  function execute(q) {
    if (terminated)`,
    to: `  function execute(q) {
    if (!socket && !initial) /* idempotent-post driver-fixes: 2 */
      return queryError(q, Errors.connection('CONNECTION_CLOSED', options))

    if (terminated)`,
  },
  {
    // The driver's own set-up queries (fetchState, the array types) keep the skip to the next host.
    name: 'a connection that dies during its first query rejects it, with several hosts too',
    from: `    if (connection.queue === queues.connecting && options.host[retries + 1])
      return`,
    to: `    if (connection.queue === queues.connecting && options.host[retries + 1] && (!query || query.handler === execute)) /* idempotent-post driver-fixes: 4 */
      return`,
  },
  {
    name: 'an error resets the row counter',
    from: `  function ErrorResponse(x) {
    if (query) {`,
    to: `  function ErrorResponse(x) {
    rows = 0 /* idempotent-post driver-fixes: 5 */
    if (query) {`,
  },
  {
    name: 'nothing is written to a socket that is gone',
    from: `    const x = socket.write(chunk, fn)`,
    to: `    const x = socket ? socket.write(chunk, fn) : false /* idempotent-post driver-fixes: 2 */`,
  },
]

/** connection.js with every fix applied; throws naming the first fix whose code is not found exactly once. */
export function patchConnectionSource(source: string): string {
  let patched = source
  for (const fix of DRIVER_FIXES) {
    const at = patched.indexOf(fix.from)
    if (at < 0 || patched.indexOf(fix.from, at + 1) >= 0)
      throw new Error(`postgres.js is not the version these fixes were written for (src/store/driver-fixes.ts: "${fix.name}" not found exactly once); pin postgres to 3.4.9 or review the fixes`)
    patched = patched.slice(0, at) + fix.to + patched.slice(at + fix.from.length)
  }
  return patched
}

/**
 * Bun 1.4 hands a runtime plugin's onLoad no file from node_modules, but it
 * does ask onResolve: the driver's own `./connection.js` is resolved into a
 * namespace of ours and loaded from there. Its relative imports are made
 * absolute, so they are the very modules the rest of the driver uses (one
 * `Errors`, one `Query`: instanceof checks hold).
 */
plugin({
  name: 'idempotent-post: postgres.js fixes',
  setup(build) {
    build.onResolve({ filter: /^\.\/connection\.js$/ }, ({ path, importer }) => {
      if (!/[\\/]postgres[\\/]src[\\/]index\.js$/.test(importer)) return undefined
      return { path: resolve(dirname(importer), path), namespace: 'idempotent-post-driver' }
    })
    build.onLoad({ filter: /.*/, namespace: 'idempotent-post-driver' }, async ({ path }) => ({
      contents: patchConnectionSource(await Bun.file(path).text())
        .replace(/from '\.\/([\w.-]+\.js)'/g, (_, file: string) => `from ${JSON.stringify(resolve(dirname(path), file))}`),
      loader: 'js',
    }))
  },
})
