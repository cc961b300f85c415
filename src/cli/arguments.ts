/** Option parsers and the options several commands share; a bad value is a usage error (exit 2). */
import { InvalidArgumentError, type Command } from 'commander'
import { isPositiveBigint } from '../operations/ids'

/** --ttl-seconds, --retention-seconds: whole seconds, as the server's own settings are. */
export function seconds(value: string): number {
  if (!/^\d{1,9}$/.test(value) || Number(value) < 1) throw new InvalidArgumentError('must be a whole number of seconds ≥ 1')
  return Number(value)
}

export function positiveInt(value: string): number {
  if (!/^\d{1,4}$/.test(value) || Number(value) < 1) throw new InvalidArgumentError('must be a whole number ≥ 1')
  return Number(value)
}

export function lease(value: string): string {
  if (!isPositiveBigint(value)) throw new InvalidArgumentError('must be a lease number as listed')
  return value
}

/** The key list's filters, as the admin page and API take them. */
export const keyFilterOptions = (command: Command): Command => command
  .option('--tenant <tenant>', 'only this tenant')
  .option('--route <route>', 'only this route, e.g. "POST /api/payments"')
  .option('--key <text>', 'only keys containing this text')
