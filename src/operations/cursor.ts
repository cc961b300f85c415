/** The key list's keyset cursor, opaque to clients: the page, the JSON API and the CLI hand out the same ones. */
import { isTimestampText } from '../store/timestamp'
import { OperationInputError } from './context'

/** Where a page of a key list ended: its order is (an instant, tenant, key), unique. */
export interface KeyCursor {
  /** The list's instant (stale_at for keys in processing, released_at for released ones) as PostgreSQL text, exact to the microsecond (a JS Date keeps only milliseconds). */
  readonly at: string
  readonly tenant: string
  readonly key: string
}

export const MAX_CURSOR_LENGTH = 1024

/** base64url of [instant, tenant, key]. */
export function encodeCursor(cursor: KeyCursor): string {
  return Buffer.from(JSON.stringify([cursor.at, cursor.tenant, cursor.key])).toString('base64url')
}

/** The cursor, or an OperationInputError when it is not one we gave out (a changed timestamp included: 400, never a database error). */
export function decodeCursor(text: string): KeyCursor {
  const bad = new OperationInputError('cursor is not one this list gave out')
  if (text.length > MAX_CURSOR_LENGTH) throw bad
  let value: unknown
  try {
    value = JSON.parse(Buffer.from(text, 'base64url').toString())
  } catch {
    throw bad
  }
  if (!Array.isArray(value) || value.length !== 3 || !value.every((part) => typeof part === 'string')) throw bad
  const [at, tenant, key] = value as [string, string, string]
  if (!isTimestampText(at) || tenant.length < 1 || tenant.length > 64 || key.length < 1 || key.length > 255) throw bad
  if ((tenant + key).includes('\u0000')) throw bad
  return { at, tenant, key }
}
