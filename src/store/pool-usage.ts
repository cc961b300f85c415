/**
 * How busy a postgres.js pool is: connections in use, and work waiting for
 * one (SPEC, metrics contract: "the database pools: connections in use and
 * waiting").
 *
 * postgres.js (3.4) keeps its connection queues private and has no pool
 * statistics (porsager/postgres#443 is open), so we count at the pool's
 * door: a handle that forwards everything to the pool and counts what it
 * sends through, from the moment the driver takes it until it settles:
 * - a statement: from its execution (the driver's `handle`, reached by
 *   `await`, `.then` or `.execute()`) to its result; a query built only as a
 *   fragment of another is never executed, and never counted;
 * - `reserve()`: from the call to `release()` (complete.ts holds one for a
 *   completing transaction);
 * - `begin()`: for the whole transaction.
 * The pool runs at most `max` of them on connections of their own; the rest
 * wait (postgres.js queues them, or pipelines them behind a busy connection's
 * statement: either way they wait for a connection). So in use is
 * min(outstanding, max) and waiting is the remainder.
 */
import type postgres from 'postgres'

type Pool = postgres.Sql<Record<string, never>>

export interface PoolUsage {
  /** The pool's size (postgres.js `max`). */
  readonly max: number
  /** Connections running our statements, transactions or reservations now. */
  readonly inUse: number
  /** Statements and transactions waiting for a connection of this pool now. */
  readonly waiting: number
}

export class PoolUsageCounter implements PoolUsage {
  #outstanding = 0
  constructor(readonly max: number) {}
  get inUse(): number { return Math.min(this.#outstanding, this.max) }
  get waiting(): number { return Math.max(0, this.#outstanding - this.max) }
  enter(): void { this.#outstanding++ }
  leave(): void { this.#outstanding-- }
}

const settle = Promise.prototype.then

/** Counts `query` from its execution to its result (a plain Promise.then: it does not execute it). */
function counted<T>(query: T, usage: PoolUsageCounter): T {
  if (!(query instanceof Promise) || typeof (query as { handle?: unknown }).handle !== 'function') return query // a fragment builder
  const q = query as unknown as { handle: () => Promise<void> }
  const handle = q.handle
  let entered = false
  q.handle = function countedHandle(this: unknown) {
    if (!entered) {
      entered = true
      usage.enter()
      const leave = () => usage.leave()
      settle.call(query, leave, leave)
    }
    return handle.call(this)
  }
  return query
}

/** A reserved connection counts until its release. */
function reservedCounted(reserved: postgres.ReservedSql<Record<string, never>>, usage: PoolUsageCounter) {
  let released = false
  return new Proxy(reserved, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver)
      if (property !== 'release' || typeof value !== 'function') return value
      return function countedRelease(...args: unknown[]) {
        if (!released) {
          released = true
          usage.leave()
        }
        return (value as (...a: unknown[]) => unknown).apply(target, args)
      }
    },
  })
}

/** `pool`, counting what goes through it into `usage`. Everything else is the pool itself. */
export function countedPool(pool: Pool, usage: PoolUsageCounter): Pool {
  return new Proxy(pool, {
    apply: (target, thisArg, args) => counted(Reflect.apply(target, thisArg, args), usage),
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver)
      if (typeof value !== 'function') return value
      if (property === 'unsafe' || property === 'file') {
        return (...args: unknown[]) => counted((value as (...a: unknown[]) => unknown).apply(target, args), usage)
      }
      if (property === 'reserve') {
        return async (...args: unknown[]) => {
          usage.enter()
          try {
            return reservedCounted(await (value as (...a: unknown[]) => Promise<postgres.ReservedSql<Record<string, never>>>).apply(target, args), usage)
          } catch (error) {
            usage.leave()
            throw error
          }
        }
      }
      if (property === 'begin') {
        return async (...args: unknown[]) => {
          usage.enter()
          try {
            return await (value as (...a: unknown[]) => Promise<unknown>).apply(target, args)
          } finally {
            usage.leave()
          }
        }
      }
      return value
    },
  })
}
