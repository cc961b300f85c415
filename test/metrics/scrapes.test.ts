/** The drain's wait for one more scrape (src/metrics/scrapes.ts), on a clock the test moves. */
import { expect, test } from 'bun:test'
import { Scrapes } from '../../src/metrics/scrapes'

test('nothing scraping regularly: no wait', async () => {
  let now = 0
  const scrapes = new Scrapes(() => now)
  expect(scrapes.patienceMs(15_000)).toBe(0)
  scrapes.seen()
  expect(scrapes.patienceMs(15_000)).toBe(0) // one read is no interval
  expect(await scrapes.next(15_000)).toBe(false)
})

test('the next scrape is expected one interval after the last, with half an interval of slack, within the cap', () => {
  let now = 0
  const scrapes = new Scrapes(() => now)
  scrapes.seen()
  now = 5_000
  scrapes.seen()
  now = 6_000 // 1 s after the last: the next at 10 s, given until 12.5 s
  expect(scrapes.patienceMs(15_000)).toBe(6_500)
  now = 11_000 // the one at 10 s was missed: the one at 15 s, until 17.5 s
  expect(scrapes.patienceMs(15_000)).toBe(6_500)
  expect(scrapes.patienceMs(2_000)).toBe(2_000)
})

test('a scrape ends the wait at once', async () => {
  let now = 0
  const scrapes = new Scrapes(() => now)
  scrapes.seen()
  now = 5_000 // scraped every 5 s: the next expected at 10 s, waited for until 12.5 s (a real timer of 7.5 s)
  scrapes.seen()
  const waiting = scrapes.next(10_000)
  setTimeout(() => scrapes.seen(), 10)
  const started = performance.now()
  expect(await waiting).toBe(true)
  expect(performance.now() - started).toBeLessThan(1_000)
})
