/** One command line, run to its exit code: each error kind to its code and one `idem: ...` line on stderr. */
import { CommanderError } from 'commander'
import { visibleJson } from '../characters'
import { OperationInputError } from '../operations'
import { EXIT, processIo, RefusedError, UsageError, type CliIo, type RunState } from './io'
import { buildProgram } from './program'

/** Runs one command line; resolves to the exit code. */
export async function runCli(argv: string[], io: CliIo = processIo): Promise<number> {
  const state: RunState = { exitCode: EXIT.ok }
  try {
    await buildProgram(io, state).parseAsync(argv, { from: 'user' })
    return state.exitCode
  } catch (error) {
    if (error instanceof CommanderError)
      return error.code === 'commander.helpDisplayed' || error.code === 'commander.version' || error.code === 'commander.help' ? EXIT.ok : EXIT.usage
    // Messages quote what the operator typed as JSON (`no key "..."`): its invisible characters as JSON escapes.
    if (error instanceof UsageError || error instanceof OperationInputError) {
      io.err(`idem: ${visibleJson(error.message)}\n`)
      return EXIT.usage
    }
    if (error instanceof RefusedError) {
      io.err(`idem: ${visibleJson(error.message)}\n`)
      return EXIT.refused
    }
    io.err(`idem: failed: ${visibleJson(error instanceof Error ? error.message : String(error))}\n`)
    return EXIT.refused
  }
}
