/**
 * What operators read is what is stored (issue 41, ASVS 5.3.1): C0, DEL, C1
 * (U+009B included), zero-width space and U+2028 in a customer reached the
 * admin page raw, and the CLI passed C1, zero-width and U+2028 to the
 * terminal: `cus_A\u200bC` showed as `cus_AC`. One rule (characters.ts)
 * writes them out as `\uXXXX`: a property test over every character of
 * Unicode's general categories Cc, Cf, Zl and Zp, then the admin page over
 * real HTTP (with the exact value one click away) and the real CLI process.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import fc from 'fast-check'
import { exactText, invisibleText, visibleJson, visibleText } from '../../src/characters'
import { writeServerSettings } from '../../src/core/settings'
import { getPage, signIn, type Signed } from '../admin/support'
import { startApp, type InProcessService } from '../support/app'
import { runIdem } from '../support/cli'
import { createTestDatabase, type TestDatabase } from '../support/db'

/** The categories the rule must write out, as Unicode's own property escapes name them. */
const CATEGORIES = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u
const CATEGORIES_ALL = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu

/** Every code point of Cc, Cf, Zl and Zp (about 230: the C0 and C1 controls, DEL, the format characters with the tags, U+2028, U+2029). */
const MEMBERS: readonly string[] = (() => {
  const found: string[] = []
  for (let code = 0; code <= 0x10ffff; code++) {
    if (code >= 0xd800 && code <= 0xdfff) continue
    const char = String.fromCodePoint(code)
    if (CATEGORIES.test(char)) found.push(char)
  }
  return found
})()

describe('the rule (characters.ts)', () => {
  test('covers every member of the categories, each written as its \\u escapes', () => {
    expect(MEMBERS.length).toBeGreaterThan(200)
    for (const char of ['\u0000', '\u0007', '\u001b', '\u007f', '\u0085', '\u009b', '\u200b', '\u200d', '\u202e', '\u2066', '\ufeff', '\u00ad', '\u2028', '\u2029', '\u{e0001}']) expect(MEMBERS).toContain(char)
    for (const char of MEMBERS) {
      const units = [...Array(char.length).keys()].map((i) => `\\u${char.charCodeAt(i).toString(16).padStart(4, '0')}`).join('')
      expect({ char: char.codePointAt(0), shown: visibleText(char) }).toEqual({ char: char.codePointAt(0), shown: units })
    }
  })

  test('property: any text with members anywhere is shown without one raw, and the shown text turns back into the stored one', () => {
    const piece = fc.oneof(
      { arbitrary: fc.constantFrom(...MEMBERS), weight: 3 },
      { arbitrary: fc.string({ unit: 'grapheme' }), weight: 2 },
      { arbitrary: fc.string({ unit: 'binary' }), weight: 1 },
      // What a client can type to look like an escape: it must not be taken for one.
      { arbitrary: fc.constantFrom('\\', '\\u200b', '\\\\', 'u200b', 'cus_A'), weight: 1 },
    )
    fc.assert(fc.property(fc.array(piece, { maxLength: 12 }), (pieces) => {
      const stored = pieces.join('')
      const shown = visibleText(stored)
      expect(shown).not.toMatch(CATEGORIES)
      expect(invisibleText(shown)).toBe(stored)
      // Visibly: every member the stored text holds is in the shown one as its escape.
      for (const char of stored.match(CATEGORIES_ALL) ?? []) expect(shown).toContain(visibleText(char))
      // JSON (a stored answer, --json): still JSON, of the same value, no member raw but JSON's own line breaks.
      const json = visibleJson(JSON.stringify({ customer: stored }, null, 2))
      expect((JSON.parse(json) as { customer: string }).customer).toBe(stored)
      expect(json.replace(/[\n]/g, '')).not.toMatch(CATEGORIES)
      expect(exactText(stored)).toMatch(/^[\x20-\x7e]*$/)
    }), { numRuns: 2_000 })
  })

  test('`cus_A\\u200bC` typed by a client (eleven characters) and the zero-width space look different', () => {
    expect(visibleText('cus_A\u200bC')).toBe('cus_A\\u200bC')
    expect(visibleText('cus_A\\u200bC')).toBe('cus_A\\\\u200bC')
    // Printable text of any script stays as it is.
    expect(visibleText('Müller 東京 😀')).toBe('Müller 東京 😀')
  })
})

const CUSTOMER = 'cus_A\u200bC'
/** C0, DEL, C1 with the CSI, U+2028, a BOM and a bidi override in one description. */
const DESCRIPTION = 'bell\u0007 del\u007f csi\u009b[2J line\u2028sep bom\ufeff rlo\u202e.'

describe('where operators read it', () => {
  let db: TestDatabase
  let service: InProcessService
  let url: string
  let admin: Signed
  beforeAll(async () => {
    db = await createTestDatabase('security_invisible')
    service = await startApp(db)
    url = service.listen()
    admin = await signIn(url)
    await writeServerSettings(db.sql, { ttlSeconds: 30, retentionSeconds: 86_400 })
    const created = await fetch(`${url}/api/payments`, {
      method: 'POST',
      headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': 'zw-paid' },
      body: JSON.stringify({ amount: 4200, currency: 'EUR', customer: CUSTOMER, description: DESCRIPTION }),
    })
    expect(created.status).toBe(201)
  })
  afterAll(async () => {
    await service?.stop()
    await db?.drop()
  })

  test('the admin key page over HTTP: the customer written out, none raw, the exact value one click away', async () => {
    const { response, html } = await getPage(url, '/admin/keys/acme/zw-paid', admin)
    expect(response.status).toBe(200)
    // The page's own markup may break lines; the data holds no line break, so any other member would be the data's.
    expect(html.replace(/[\n\t\r]/g, '')).not.toMatch(CATEGORIES)
    // In the summary and the payment: `cus_A\u200bC`, never `cus_AC`.
    expect(html).toContain('customer cus_A\\u200bC, 4200 EUR')
    expect(html).toMatch(/<dt>Customer<\/dt><dd class="mono"><span>cus_A\\u200bC<\/span><details class="exact"><summary>exact<\/summary><code>&quot;cus_A\\u200bC&quot;<\/code><\/details><\/dd>/)
    expect(html).not.toContain('cus_AC')
    // The stored answer: its JSON escapes for them, the description's C1 CSI and U+2028 included.
    expect(html).toContain('csi\\u009b[2J line\\u2028sep')
  })

  test('the CLI, a real process: idem show writes them out; --json is the same value, none raw', async () => {
    const shown = await runIdem(db.url, ['show', 'acme', 'zw-paid'])
    expect(shown.code).toBe(0)
    expect(shown.stdout).toContain(`for cus_A\\u200bC, charge`)
    expect(shown.stdout.replace(/\n/g, '')).not.toMatch(CATEGORIES)
    const json = await runIdem(db.url, ['show', 'acme', 'zw-paid', '--json'])
    expect(json.code).toBe(0)
    expect(json.stdout.replace(/\n/g, '')).not.toMatch(CATEGORIES)
    expect(JSON.stringify(JSON.parse(json.stdout))).toContain(JSON.stringify(CUSTOMER).slice(1, -1))
    // An operator's own argument, quoted back in a refusal, is written out too.
    const missing = await runIdem(db.url, ['show', 'acme', 'zw\u009b\u200bmissing'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain('zw\\u009b\\u200bmissing')
    expect(missing.stderr.replace(/\n/g, '')).not.toMatch(CATEGORIES)
  })
})
