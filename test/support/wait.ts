/**
 * Tests wait on signals, not time: `waitFor` polls a condition and fails
 * naming what it waited for. The poll interval only bounds how late the test
 * notices; nothing depends on it.
 */
import type postgres from 'postgres'
import { KEY_STATES } from '../../src/core/key-states'

const POLL_MS = 10

/** `what` may be a function, to describe the state at the timeout (e.g. "3 of 5 answered"). */
export async function waitFor(condition: () => boolean | Promise<boolean>, what: string | (() => string), timeoutMs = 10_000, everyMs = POLL_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await condition()) return
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${typeof what === 'function' ? what() : what}`)
    await Bun.sleep(everyMs)
  }
}

/**
 * waitFor's form for a caller that goes on either way (escalates a signal,
 * reports a measure): polls `condition` until it holds (true) or the
 * deadline passes (false). Still a wait for an event, with a deadline.
 */
export async function waitUntil(condition: () => boolean | Promise<boolean>, timeoutMs: number, everyMs = POLL_MS): Promise<boolean> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await condition()) return true
    if (Date.now() >= deadline) return false
    await Bun.sleep(everyMs)
  }
}

/** `promise`'s value, or `timedOut` when it has not settled within `timeoutMs` (it goes on; a late rejection is dropped). */
export async function within<T, U>(promise: Promise<T>, timeoutMs: number, timedOut: U): Promise<T | U> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const late = new Promise<U>((resolve) => { timer = setTimeout(() => resolve(timedOut), timeoutMs) })
  promise.catch(() => undefined)
  try {
    return await Promise.race([promise, late])
  } finally {
    clearTimeout(timer)
  }
}

/** How many of `keys` (of `tenant`) are in `status`. */
export async function keysIn(sql: postgres.Sql, status: 'processing' | 'done' | 'released', keys: readonly string[], tenant = 'acme'): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    select count(*)::int as n from ${sql.unsafe(KEY_STATES)} k where k.tenant = ${tenant} and k.key in ${sql(keys as string[])} and k.status = ${status}`
  return row!.n
}

/**
 * Waits until every one of `keys` is claimed (its row in processing): the
 * requests are past their claim, in their foreign call. Under atomic phases
 * nothing holds a key's row lock while it processes, so the row's state is
 * the signal (a `rowLocked` check would never see one).
 */
export async function waitForClaims(sql: postgres.Sql, keys: readonly string[], tenant = 'acme', timeoutMs?: number): Promise<void> {
  await waitFor(async () => await keysIn(sql, 'processing', keys, tenant) === keys.length,
    `${keys.length === 1 ? `key ${keys[0]}` : `${keys.length} keys`} of ${tenant} to be claimed (in processing)`, timeoutMs)
}

/**
 * One turn of the event loop: resolves after every microtask queued now has
 * run and the runtime has reported the rejections left without a handler
 * (Bun reports them when the microtask queue drains, before the next task).
 * Not a wait for time: a test asserting that nothing was left unhandled
 * needs this turn, and no more.
 */
export function nextTurn(): Promise<void> {
  return new Promise<void>((resolve) => setImmediate(resolve))
}

/** A promise's state without waiting for it: `settled()` is true once it resolved or rejected. */
export function track<T>(promise: Promise<T>): { promise: Promise<T>; settled(): boolean } {
  let done = false
  promise.then(() => { done = true }, () => { done = true })
  return { promise, settled: () => done }
}

/**
 * waitFor's form for a value: polls `check` until it returns one (errors
 * count as "not yet"), and returns it; fails naming what it waited for and
 * the last error seen.
 */
export async function waitForValue<T>(what: string, check: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs = 30_000, everyMs = 50): Promise<T> {
  let value: T | undefined
  let last: unknown
  await waitFor(async () => {
    try {
      const seen = await check()
      if (seen) value = seen
      return Boolean(seen)
    } catch (error) {
      last = error
      return false
    }
  }, () => `${what}${last ? `: ${String(last)}` : ''}`, timeoutMs, everyMs)
  return value as T
}
