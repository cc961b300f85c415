/** The `idem` command line: its global options and every command group, on one commander program. */
import { Command } from 'commander'
import type { GivenSettings } from '../operations/context'
import { seconds } from './arguments'
import { addActionCommands } from './commands/actions'
import { addAuditCommand } from './commands/audit'
import { addKeyCommands } from './commands/keys'
import { addReleasedCommand } from './commands/released'
import { withOperations } from './connection'
import type { CliContext } from './context'
import { EXIT, processIo, type CliIo, type RunState } from './io'
import { output } from './output'

export function buildProgram(io: CliIo = processIo, state: RunState = { exitCode: EXIT.ok }): Command {
  const program = new Command('idem')
    .description('Operate idempotency keys: find and clear stuck keys, purge expired ones (the same operations as /admin, recorded in the audit trail).')
    .showHelpAfterError()
    .exitOverride()
    .configureOutput({ writeOut: (text) => io.out(text), writeErr: (text) => io.err(text) })
    // For an app's database, where no server records its settings (operations/context.ts).
    .option('--ttl-seconds <n>', 'the TTL your app runs with, where no server recorded one in the database', seconds)
    .option('--retention-seconds <n>', 'the retention your app runs with, where no server recorded one in the database', seconds)

  const context: CliContext = {
    io,
    state,
    out: output(io),
    // Read when a command runs: the global options may come after the command's name.
    withOperations: (work) => {
      const { ttlSeconds, retentionSeconds } = program.opts<GivenSettings>()
      return withOperations(io, { ttlSeconds, retentionSeconds }, work)
    },
  }
  // In the order `idem --help` lists them.
  addKeyCommands(program, context)
  addReleasedCommand(program, context)
  addActionCommands(program, context)
  addAuditCommand(program, context)
  return program
}
