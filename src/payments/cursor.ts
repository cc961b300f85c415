/**
 * Keyset cursor for the payments list: the (created_at, id) of the last row
 * shown. Clients hold it, so a cursor may come back changed: it is signed
 * (signed-cursor.ts) with a key derived from the API key it was given to, so
 * an edited cursor, or one given to another key, is refused here (400), as
 * is anything not exactly what encodeCursor writes with a timestamp
 * PostgreSQL takes; none of it reaches the query (which answered a 500).
 * Every instance with the same API_KEYS checks the same signature; rotating
 * a key ends the cursors given to it (the list starts again).
 */
import { cursorSigningKey, openCursor, signCursor } from '../signed-cursor'
import { isTimestampText } from '../store/timestamp'

export interface Cursor {
  readonly createdAt: string
  readonly id: string
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/
/** base64url of `<timestamp>|<uuid>`: about 90 characters; 200 leaves room and bounds the work. */
const MAX_PAYLOAD = 200

/** The key cursors given to the holder of `apiKey` are signed with. */
export function cursorKey(apiKey: string): Buffer {
  return cursorSigningKey('payments', apiKey)
}

export function encodeCursor(cursor: Cursor, key: Buffer): string {
  return signCursor(`${cursor.createdAt}|${cursor.id}`, key)
}

export function decodeCursor(raw: string, key: Buffer): Cursor | undefined {
  const text = openCursor(raw, key, MAX_PAYLOAD)
  if (text === undefined) return undefined
  const [createdAt, id, ...rest] = text.split('|')
  if (rest.length > 0 || !createdAt || !id || !UUID.test(id) || !isTimestampText(createdAt)) return undefined
  return { createdAt, id }
}

export function isUuid(value: string): boolean {
  return UUID.test(value)
}
