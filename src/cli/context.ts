/** What every command group is given: the terminal, its output, the run's exit state and the operations. */
import type { Operations } from '../operations'
import type { CliIo, RunState } from './io'
import type { Output } from './output'

export interface CliContext {
  readonly io: CliIo
  readonly state: RunState
  readonly out: Output
  /** Runs `work` with the operations on the database (connection.ts), under the settings the command line gave. */
  withOperations<T>(work: (ops: Operations) => Promise<T>): Promise<T>
}
