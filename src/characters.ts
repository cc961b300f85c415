/**
 * Length in characters: Unicode code points, as JSON Schema's maxLength and
 * PostgreSQL's length() count them. A JS string's length counts UTF-16
 * units, so 40 emoji (80 units) failed a 64-character bound. Lone surrogates
 * are refused before any length is judged (http/body.ts).
 */
export function characters(text: string): number {
  let count = 0
  for (const _ of text) count++
  return count
}

/**
 * Unicode's bidirectional controls (the embeddings, overrides and isolates,
 * and the marks): invisible, and they reorder what follows them, so a
 * client-chosen `cus_\u202Eevil` shows as another text on an operator's
 * screen. In what the admin and the CLI show they are written out instead.
 */
const BIDI_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g

export function visibleBidi(text: string): string {
  return text.replace(BIDI_CONTROLS, (char) => `<U+${char.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}>`)
}
