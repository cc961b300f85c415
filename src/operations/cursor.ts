/** The key list's keyset cursor, opaque to clients: the page, the JSON API and the CLI hand out the same ones. */
import { OperationInputError } from './context'

/** Where a page ended: the list's order is (stale_at, tenant, key), unique. */
export interface KeyCursor {
  /** stale_at as PostgreSQL text, exact to the microsecond (a JS Date keeps only milliseconds). */
  readonly staleAt: string
  readonly tenant: string
  readonly key: string
}

const TIMESTAMP = /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?[+-]\d{2}(:\d{2})?$/
export const MAX_CURSOR_LENGTH = 1024

/** base64url of [stale_at, tenant, key]. */
export function encodeCursor(cursor: KeyCursor): string {
  return Buffer.from(JSON.stringify([cursor.staleAt, cursor.tenant, cursor.key])).toString('base64url')
}

/** The cursor, or an OperationInputError when it is not one we gave out. */
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
  const [staleAt, tenant, key] = value as [string, string, string]
  if (!TIMESTAMP.test(staleAt) || tenant.length < 1 || tenant.length > 64 || key.length < 1 || key.length > 255) throw bad
  if ((tenant + key).includes('\u0000')) throw bad
  return { staleAt, tenant, key }
}
