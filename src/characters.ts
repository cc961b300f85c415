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
