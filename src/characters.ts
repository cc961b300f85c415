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
 * What operators read is what is stored (issue 41): one rule for every
 * client-chosen string shown on the admin pages, by the CLI and in the logs.
 * Shown visibly, as a `\uXXXX` escape (lower-case hex, four digits; a
 * character beyond U+FFFF as its two UTF-16 escapes, as JSON writes it):
 *
 * - the controls (Cc: C0, DEL, C1 with U+009B, the terminals' CSI);
 * - the format characters (Cf: zero-width space U+200B, ZWJ U+200D, the bidi
 *   controls, which reorder what follows them, the BOM, soft hyphen, tags);
 * - the line and paragraph separators (Zl U+2028, Zp U+2029);
 * - spaces other than U+0020 (Zs: no-break, em, ideographic spaces), and
 *   every other default-ignorable code point (U+3164 Hangul filler,
 *   variation selectors): each looks like nothing, or like a plain space;
 * - lone surrogates (Cs), which no screen can draw;
 * - and `\` itself, as `\\`, so an escape on the screen is always ours:
 *   `cus_A\u200bC` (the zero-width space) and `cus_A\\u200bC` (the eleven
 *   characters a client typed) look different. Printable characters of any
 *   script stay as they are.
 *
 * So `cus_A\u200bC` shows as `cus_A\u200bC`, not as `cus_AC`, and
 * `invisibleText` turns what is shown back into what is stored. Where the
 * text is JSON already (a stored answer, `--json`), `visibleJson` writes the
 * same escapes but leaves `\` (JSON has escaped it) and the line breaks and
 * tabs between tokens (JSON strings hold none raw): the result is JSON of the
 * same value. Log lines (log.ts) escape everything outside printable ASCII
 * with the same `\uXXXX`, a superset of this rule.
 */
const INVISIBLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}\p{Default_Ignorable_Code_Point}]|(?! )\p{Zs}/gu
const INVISIBLE_OR_BACKSLASH = new RegExp(`\\\\|${INVISIBLE.source}`, 'gu')
/** JSON's whitespace between tokens stays: a line break or a tab inside a JSON string is always escaped already. */
const INVISIBLE_IN_JSON = new RegExp(`(?![\\n\\t])(?:${INVISIBLE.source})`, 'gu')

/** `\uXXXX` for each UTF-16 unit of `char` (the notation of JSON and of the log lines). */
export function unicodeEscape(char: string): string {
  let text = ''
  for (let i = 0; i < char.length; i++) text += `\\u${char.charCodeAt(i).toString(16).padStart(4, '0')}`
  return text
}

/** A client-chosen string as operators are shown it (the rule above). */
export function visibleText(text: string): string {
  return text.replace(INVISIBLE_OR_BACKSLASH, (char) => (char === '\\' ? '\\\\' : unicodeEscape(char)))
}

/** A JSON text with the same escapes: still JSON, of the same value (the rule above). */
export function visibleJson(json: string): string {
  return json.replace(INVISIBLE_IN_JSON, unicodeEscape)
}

/** What visibleText showed, back to what is stored. */
export function invisibleText(shown: string): string {
  return shown.replace(/\\(?:\\|u([0-9a-f]{4}))/g, (escape, hex: string | undefined) => (hex === undefined ? '\\' : String.fromCharCode(parseInt(hex, 16))))
}

/** The exact value, for the page's "exact" view: as JSON, everything outside printable ASCII escaped (as log.ts writes it). */
export function exactText(value: unknown): string {
  return (JSON.stringify(value) ?? '').replace(/[^\x20-\x7e]/g, unicodeEscape)
}
