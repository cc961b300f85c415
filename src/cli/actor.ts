/** Who runs a command, for the audit trail. */
import { UsageError, type CliIo } from './io'

/** Operator names for the audit trail: printable, short, no spaces at the ends. */
const ACTOR_NAME = /^[!-~](?:[ -~]{0,118}[!-~])?$/

/**
 * Who runs a command, for the audit trail: the OS user of this uid (else
 * $USER), which the shell session vouches for; `--actor` is what the operator
 * says of themselves, kept beside it as a note (`cli:deploy (night shift)`),
 * never in its place: the trail's actor does not come from free text alone.
 * Never a made-up "unknown": with neither an OS user nor $USER, the uid
 * stands for it if --actor names the person; with nothing at all the action
 * is refused (exit 2) before anything is done.
 */
export function resolveActor(option: string | undefined, io: Pick<CliIo, 'env' | 'osUser'>, uid = process.getuid?.()): string {
  let note: string | undefined
  if (option !== undefined) {
    note = option.trim()
    if (!ACTOR_NAME.test(note)) throw new UsageError('--actor must be 1 to 120 printable characters')
  }
  let name: string | undefined
  try {
    name = io.osUser().trim() || undefined
  } catch {
    // no passwd entry for this uid (a container's arbitrary uid): try $USER
  }
  name ??= io.env.USER?.trim() || undefined
  if (name !== undefined && !ACTOR_NAME.test(name)) name = undefined
  if (name === undefined && note !== undefined && uid !== undefined) name = `uid-${uid}`
  if (name === undefined)
    throw new UsageError('no actor for the audit trail: $USER is unset and this uid has no passwd entry; name yourself with --actor <name>')
  return note === undefined ? `cli:${name}` : `cli:${name} (${note})`
}
