/**
 * A table held in ACCESS EXCLUSIVE mode by a transaction of the test's own,
 * so statements that touch it wait on the lock. `release` ends the transaction
 * before the connection goes back to the pool, whatever happened in between:
 * a connection handed back inside its transaction would keep the lock, and
 * every later test touching the table would hang behind it.
 */
import type postgres from 'postgres'

export interface TableLock {
  /** The holding backend's pid. */
  readonly pid: number
  /** Rolls the holding transaction back (once) and gives the connection back. */
  release(): Promise<void>
}

export async function lockTable(sql: postgres.Sql, table: string): Promise<TableLock> {
  const holder = await sql.reserve()
  let released = false
  let pid: number
  try {
    await holder`begin`
    await holder`lock table ${holder(table)} in access exclusive mode`
    pid = (await holder<{ pid: number }[]>`select pg_backend_pid() as pid`)[0]!.pid
  } catch (error) {
    await holder`rollback`.catch(() => {})
    holder.release()
    throw error
  }
  return {
    pid,
    async release() {
      if (released) return
      released = true
      try {
        await holder`rollback`
      } finally {
        holder.release()
      }
    },
  }
}
